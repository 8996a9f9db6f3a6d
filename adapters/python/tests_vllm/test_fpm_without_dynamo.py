"""TandemScheduler's Dynamo forward-pass metrics (tandem/vllm/metrics.py) where the dynamo
package is absent (make test-vllm's virtualenv): the switches Dynamo sets are read as Dynamo
reads them, and with a switch on but no dynamo package the scheduler starts without a
publisher and says why, once, in a warning. The messages themselves are compared with Dynamo's
InstrumentedScheduler by make test-dynamo (tests_dynamo/test_dynamo_fpm.py)."""
import importlib.util
import logging

import pytest

from conftest import make_configs

from vllm.v1.structured_output import StructuredOutputManager

from tandem.vllm.metrics import fpm_enabled, fpm_port


def test_fpm__switches_read_as_dynamo_reads_them():
    assert not fpm_enabled({})
    assert fpm_enabled({"DYN_FORWARDPASS_METRIC_PORT": "23456"})
    assert fpm_enabled({"DYN_FPM_TRACE": "1"}) and fpm_enabled({"DYN_FPM_TRACE": " On "})
    assert not fpm_enabled({"DYN_FPM_TRACE": "0"}) and not fpm_enabled({"DYN_FPM_TRACE": "x"})


def test_fpm__port_is_base_plus_dp_index(tiny_model):
    vc, _ = make_configs(tiny_model)
    assert fpm_port(vc, {}) == 20380
    assert fpm_port(vc, {"DYN_FORWARDPASS_METRIC_PORT": "23456"}) == 23456
    vc.parallel_config.data_parallel_index = 3
    assert fpm_port(vc, {"DYN_FORWARDPASS_METRIC_PORT": "23456"}) == 23459
    with pytest.raises(ValueError, match="DYN_FORWARDPASS_METRIC_PORT"):
        fpm_port(vc, {"DYN_FORWARDPASS_METRIC_PORT": "70000"})


@pytest.mark.skipif(importlib.util.find_spec("dynamo") is not None,
                    reason="the dynamo package is installed here")
def test_fpm__on_without_dynamo_warns_and_publishes_nothing(tiny_model, monkeypatch, caplog):
    from tandem.vllm import TandemScheduler
    monkeypatch.setenv("DYN_FORWARDPASS_METRIC_PORT", "23456")
    vc, kv = make_configs(tiny_model)
    with caplog.at_level(logging.WARNING, logger="tandem.vllm.metrics"):
        s = TandemScheduler(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=16,
                            structured_output_manager=StructuredOutputManager(vc))
    try:
        assert s._fpm is None
        assert "dynamo package is not importable" in caplog.text
    finally:
        s.shutdown()


@pytest.mark.skipif(importlib.util.find_spec("dynamo") is not None,
                    reason="the dynamo package is installed here")
def test_fpm__instrumented_scheduler_without_dynamo_is_a_clear_import_error():
    """tandem.vllm.dynamo imports without Dynamo (the connector module path); its
    TandemInstrumentedScheduler, a subclass of Dynamo's class, is an ImportError naming
    ai-dynamo, raised where vLLM resolves --scheduler-cls."""
    import tandem.vllm.dynamo as td
    from vllm.utils.import_utils import resolve_obj_by_qualname
    assert td.INSTRUMENTED_SCHEDULER_CLS == "tandem.vllm.dynamo.TandemInstrumentedScheduler"
    with pytest.raises(ImportError, match="needs the ai-dynamo package"):
        td.TandemInstrumentedScheduler
    with pytest.raises(ImportError, match="use tandem.vllm.TandemScheduler"):
        resolve_obj_by_qualname(td.INSTRUMENTED_SCHEDULER_CLS)
    with pytest.raises(AttributeError):
        td.NoSuchThing
