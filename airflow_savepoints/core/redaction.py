"""Which configuration values are secret, and how they are hidden in what the package writes or answers.

The key-name rule is Airflow's secrets masker's (``should_hide_value_for_key``: the lower-cased
name, with runs of non-word characters made ``_``, contains one of the words), with its default
list and the words of the package's storage options. The core never imports Airflow, so the list
lives here, once; the Airflow side (hooks, operators) uses it too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "***"

# Airflow's DEFAULT_SENSITIVE_FIELDS, plus the words of fsspec's storage options ("key", "sas", "credential")
SECRET_KEY_WORDS = frozenset({
    "access_key", "access_token", "api_key", "apikey", "auth_header", "authorization", "bearer", "connection_string",
    "dsn", "passphrase", "passwd", "password", "private_key", "proxy", "proxies", "secret", "service_account",
    "service_key", "token", "keyfile_dict", "webhook_url", "key", "credential", "sas",
})
MIN_MASKED_LENGTH = 5  # Airflow's [logging] min_length_masked_secret: shorter values are not hunted in free text


def is_secret_key(name: str) -> bool:
    """Whether a configuration key names a secret (``spark.hadoop.fs.s3a.secret.key``, ``...password``)."""
    normalized = re.sub(r"\W+", "_", name.strip().lower())
    return any(word in normalized for word in SECRET_KEY_WORDS)


def redact_conf(conf: dict[str, str], hidden: Iterable[str] = ()) -> dict[str, str]:
    """``conf`` with the values of secret-looking keys, and of the keys in ``hidden``, replaced by ``***``."""
    hidden = set(hidden)
    return {key: REDACTED if key in hidden or is_secret_key(key) else value for key, value in conf.items()}


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of the (long enough) ``secrets`` replaced by ``***``."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_MASKED_LENGTH}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_command(command: list[str], secrets: Iterable[str]) -> list[str]:
    """A command line with ``--conf KEY=VALUE`` of secret-looking keys and the ``secrets`` hidden."""
    secrets = list(secrets)
    shown: list[str] = []
    for index, arg in enumerate(command):
        key, sep, _ = arg.partition("=")
        if sep and index > 0 and command[index - 1] == "--conf" and is_secret_key(key):
            arg = f"{key}={REDACTED}"
        shown.append(redact_text(arg, secrets))
    return shown
