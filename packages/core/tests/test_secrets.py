"""Credentials and endpoints that may carry secrets stay out of reprs, vars() and error messages."""

from __future__ import annotations

import pytest
from o41_training_data import ConfigError, TrainingData

KEYS = {"access_key_id": "AKIDEXAMPLE", "secret_access_key": "wJalrXUtnFEMI-K7MDENG"}


@pytest.mark.parametrize(
    ("endpoint", "what"),
    [
        ("http://127.0.0.1:9000/?X-Amz-Signature=SECRETSIG", "a query or fragment"),
        ("http://127.0.0.1:9000/SECRETPATH", "a path"),
        ("http://127.0.0.1:9000#SECRETFRAG", "a query or fragment"),
        ("http://AKID:SECRETPW@127.0.0.1:9000", "credentials"),
        ("ftp://SECRETHOST", "no http:// or https:// scheme"),
        ("http://", "no valid host"),
    ],
)
def test_an_endpoint_that_may_hide_a_secret_is_refused_without_echoing_it(endpoint: str, what: str) -> None:
    with pytest.raises(ConfigError, match=what) as info:
        TrainingData(s3_base_url=endpoint, **KEYS)
    assert "SECRET" not in str(info.value)
    assert info.value.option == "s3_base_url"


def test_reprs_and_vars_show_no_credentials_and_no_host_name() -> None:
    named = TrainingData(s3_base_url="https://sk-SECRETTOKEN.storage.example:443", **KEYS)
    local = TrainingData(s3_base_url="http://127.0.0.1:9000", **KEYS)
    for shown in (repr(named), repr(named.storage_config), repr(vars(named.storage_config))):
        assert "SECRETTOKEN" not in shown
        assert KEYS["secret_access_key"] not in shown
        assert KEYS["access_key_id"] not in shown
    assert "https://<host " in repr(named)
    # Two endpoints stay told apart; an IP address is no secret and shows for debugging.
    other = TrainingData(s3_base_url="https://other.storage.example:443", **KEYS)
    assert repr(other) != repr(named)
    assert "http://127.0.0.1:9000" in repr(local)
    # The credentials still work as the strings they are.
    assert local.storage_config.secret_access_key == KEYS["secret_access_key"]
    assert isinstance(local.storage_config.secret_access_key, str)


@pytest.mark.parametrize(
    ("endpoint", "keys", "option"),
    [
        ("http://[x]:9", KEYS, "s3_base_url"),
        ("http://127.0.0.1:9", {**KEYS, "access_key_id": "SECRETKEY\r\nX-Injected: 1"}, "access_key_id"),
        ("http://127.0.0.1:9", {**KEYS, "session_token": "SECRETTOKEN\n"}, "session_token"),
    ],
)
def test_settings_the_http_client_would_panic_on_are_config_errors_at_open(
    endpoint: str, keys: dict[str, str], option: str
) -> None:
    from o41_training_data import BatchStreamConfig, FileSource, ProjectedField, Stage

    config = BatchStreamConfig(
        fields=[ProjectedField("v", "v", "i64")],
        stages=[Stage(sources=[FileSource(files=["s3://bucket/a.parquet"])], batch_size=1)],
    )
    # Before the fix an engine thread panicked at the first signed request ("internal error").
    with pytest.raises(ConfigError) as info:
        TrainingData(s3_base_url=endpoint, region="us-east-1", **keys).batch_stream(config).close()
    assert info.value.option == option
    assert "SECRET" not in str(info.value)
    assert "Injected" not in str(info.value)
