"""Run one edge replica: `python -m api` (settings from PARLEY_* environment variables)."""

from __future__ import annotations

import logging
import ssl

import uvicorn

from api.app import create_app
from api.forwarded import Networks
from api.server import guarded
from api.settings import ApiSettings
from runtime import keys, logs

log = logging.getLogger("parley.api")


def tls(settings: ApiSettings) -> dict[str, str]:
    """uvicorn's TLS arguments, once the certificate and key load together; none without them. Refuses to start,
    saying which file and why (never what is in it), when one is set without the other or they do not load."""
    cert, key = settings.tls_cert_file, settings.tls_key_file
    if not cert and not key:
        return {}
    if not (cert and key):
        raise SystemExit(
            "TLS needs both PARLEY_TLS_CERT_FILE and PARLEY_TLS_KEY_FILE; one is empty"
        )
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SystemExit(
            f"TLS: the certificate {cert} and key {key} do not load: {reason}"
        ) from None
    log.info("serving HTTPS with the certificate %s", cert)
    return {"ssl_certfile": cert, "ssl_keyfile": key}


def main() -> None:
    settings = ApiSettings()
    logs.configure(settings.log_level, settings.log_format)
    keys.check(settings)
    secure = tls(settings)
    trusted = Networks(settings.trusted_proxies)
    protocol = guarded(settings.header_timeout_s, settings.max_connections_per_client, trusted)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        http=protocol,
        proxy_headers=False,  # api/forwarded.py reads them, from trusted proxies only
        **secure,  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    main()
