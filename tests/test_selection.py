"""Backend selection: priority walk, precedence, NVTE_* switches, errors, explain(), cache, logging."""

from __future__ import annotations

import logging
import os

import pytest
import torch

import attention
from attention import selection
from attention.backends.base import Backend, Capabilities
from attention.params import AttentionParams


class FakeBackend(Backend):
    """A backend that runs when ``can_run`` and counts how often selection asked it."""

    capabilities = Capabilities(dtypes=frozenset({torch.float32}), device_types=frozenset({"cpu"}))

    def __init__(self, name: str, can_run: bool = True):
        self.name = name
        self.can_run = can_run
        self.asked = 0
        self.ran = 0

    def extra_reasons(self, params):
        self.asked += 1
        return [] if self.can_run else [f"{self.name} refuses on purpose"]

    def forward(self, call):
        self.ran += 1
        q = call.query
        return q.new_zeros(q.shape[:-1] + (call.params.head_dim_v,))


@pytest.fixture
def fakes(monkeypatch):
    backends = {name: FakeBackend(name) for name in selection.PRIORITY}
    monkeypatch.setattr(selection, "registry", lambda: backends)
    selection.clear_cache()
    yield backends
    selection.clear_cache()


PARAMS = AttentionParams(dtype=torch.float32, device_type="cpu")


def make_inputs():
    q = torch.randn(1, 4, 2, 8)
    return q, torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)


def module(**kwargs):
    return attention.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="causal", **kwargs)


def test_automatic_priority_takes_first_runnable(fakes):
    fakes["fused"].can_run = False
    assert selection.select(PARAMS).name == "flash3"


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"NVTE_FUSED_ATTN": "0"}, "flash3"),
        ({"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN": "0"}, "unfused"),
        ({"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN_V3": "0"}, "flash4"),
        ({"NVTE_FUSED_ATTN": "0", "NVTE_FLASH_ATTN_V3": "0", "NVTE_FLASH_ATTN_V4": "0"}, "flash2"),
        ({"NVTE_FUSED_ATTN": "1"}, "fused"),
    ],
)
def test_environment_switches(fakes, monkeypatch, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert selection.select(PARAMS).name == expected


@pytest.mark.parametrize("value", ["2", "yes", ""])
def test_bad_env_value_names_the_variable(fakes, monkeypatch, value):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", value)
    with pytest.raises(ValueError, match="NVTE_UNFUSED_ATTN"):
        selection.select(PARAMS)


def test_backend_lists_may_be_any_iterable_of_names():
    assert selection.expand_names({"unfused"}) == ("unfused",)
    assert selection.expand_names(name for name in ("fused", "unfused")) == ("fused", "unfused")
    with pytest.raises(ValueError, match="backend must be a backend name or a sequence of them"):
        selection.expand_names(3)


def test_every_backend_switched_off_is_said_first(fakes, monkeypatch):
    """The error blamed the inputs and listed no backend when the switches had left none to try."""
    for name in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.setenv(name, "0")
    with pytest.raises(ValueError) as err:
        selection.select(PARAMS)
    assert str(err.value).splitlines()[0] == (
        "No dot product attention backend is available: the environment turns every backend off "
        "(NVTE_FUSED_ATTN=0, NVTE_FLASH_ATTN=0, NVTE_UNFUSED_ATTN=0).")
    assert selection.explain_params(PARAMS).splitlines()[0] == str(err.value).splitlines()[0]


def test_nothing_runs_lists_inputs_and_every_reason(fakes, monkeypatch):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    for backend in fakes.values():
        backend.can_run = False
    with pytest.raises(ValueError) as err:
        selection.select(PARAMS)
    text = str(err.value)
    assert text.startswith("No dot product attention backend is available")
    assert "head_dim_qk = 64" in text                      # the inputs
    for name in ("fused", "flash3", "flash4", "flash2"):
        assert f"{name} refuses on purpose" in text
    assert "disabled by environment: unfused" in text


def test_precedence_constructor_over_context_over_env(fakes, monkeypatch):
    q, k, v = make_inputs()
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    auto, pinned = module(), module(backend="fused")
    auto(q, k, v)
    assert auto.last_backend == "flash3"                   # environment
    with attention.use_backends("flash2", "unfused"):
        auto(q, k, v)
        assert auto.last_backend == "flash2"               # context manager beats environment
        pinned(q, k, v)
        assert pinned.last_backend == "fused"              # constructor beats both
    auto(q, k, v)
    assert auto.last_backend == "flash3"                   # context restored on exit


@pytest.mark.parametrize("names", [("flash2", "unfused"), (["flash2", "unfused"],), ("flash2, unfused",)],
                         ids=["arguments", "list", "string"])
def test_use_backends_takes_the_names_as_backend_does(fakes, names):
    """Separate names, one sequence or one comma-separated string (a list was refused as an unknown name)."""
    attn = module()
    with attention.use_backends(*names):
        attn(*make_inputs())
        assert selection.context_backends() == ("flash2", "unfused")
    assert attn.last_backend == "flash2"


def test_family_name_expands_to_generations(fakes):
    fakes["flash3"].can_run = False
    attn = module(backend="flash")
    attn(*make_inputs())
    assert attn.last_backend == "flash4"
    assert selection.expand_names("flash, unfused") == ("flash3", "flash4", "flash2", "unfused")


def test_requested_backend_never_falls_back(fakes):
    fakes["fused"].can_run = False
    attn = module(backend="fused")
    with pytest.raises(ValueError, match="fused refuses on purpose") as err:
        attn(*make_inputs())
    assert "never falls back" in str(err.value)
    assert fakes["unfused"].ran == 0


@pytest.mark.parametrize("bad", ["cudnn", ["fused", "xformers"], ""])
def test_unknown_backend_name(bad):
    with pytest.raises(ValueError, match="backend"):
        module(backend=bad)
    with pytest.raises(ValueError, match="use_backends"):
        with attention.use_backends(*([bad] if isinstance(bad, str) else bad)):
            pass


def test_explain_says_why_without_running(fakes):
    fakes["fused"].can_run = False
    attn = module()
    text = attn.explain(*make_inputs())
    assert text.startswith("Selected backend: flash3")
    assert "fused is not supported because:\n    - fused refuses on purpose" in text
    assert all(b.ran == 0 for b in fakes.values())
    assert attention.explain(attn, *make_inputs()) == text


def test_explain_heads_a_refusal_with_the_error_s_first_line(fakes):
    """Nothing can run: explain() starts as the call's error would, named backend or automatic walk."""
    fakes["fused"].can_run = False
    named = module(backend="fused")
    assert named.explain(*make_inputs()).startswith(
        "Backend fused was requested (backend= argument) but cannot run these inputs")
    for fake in fakes.values():
        fake.can_run = False
    assert module().explain(*make_inputs()).startswith(selection.NO_BACKEND)


def test_selection_is_cached_per_params(fakes):
    fakes["fused"].can_run = False
    other = AttentionParams(dtype=torch.float32, device_type="cpu", max_seqlen_q=1)
    for _ in range(5):                                     # alternating prefill/decode-like params
        selection.select(PARAMS)
        selection.select(other)
    assert fakes["fused"].asked == 2 and fakes["flash3"].asked == 2


def test_info_once_per_configuration_and_debug_reasons(fakes, monkeypatch, caplog):
    fakes["fused"].can_run = False
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "2")
    with caplog.at_level(logging.DEBUG, logger="attention"):
        for _ in range(3):
            selection.select(PARAMS)
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    debugs = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(infos) == 1 and "Running with flash3 backend" in infos[0].getMessage()
    assert any("fused refuses on purpose" in m for m in debugs)


@pytest.fixture
def fresh_logger(monkeypatch):
    """The "attention" logger and configure_logging's record of it as a fresh process has them (restored after)."""
    logger = logging.getLogger("attention")
    for name, value in (("_handler", None), ("_applied", None), ("_level_set", None),
                        ("_level_before", logging.NOTSET)):
        monkeypatch.setattr(selection, name, value)
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    return logger


def test_debug_level_maps_to_logger_level(fakes, monkeypatch, fresh_logger):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    for level, expected in (("0", logging.WARNING), ("1", logging.INFO), ("2", logging.DEBUG)):
        monkeypatch.setenv("NVTE_DEBUG_LEVEL", level)
        selection.configure_logging()
        assert logging.getLogger("attention").level == expected


def test_a_debug_level_that_is_not_an_integer_is_named(fakes, monkeypatch):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "verbose")
    with pytest.raises(ValueError, match=r"NVTE_DEBUG_LEVEL must be an integer: 0 \(warnings\), 1 \(info\) or 2 "
                                         r"\(debug; larger counts as 2, below 0 as 0\); got 'verbose'"):
        selection.configure_logging()


@pytest.mark.parametrize("level", ["", "x"])
@pytest.mark.parametrize("debug", [None, "0", "1"])
def test_a_set_debug_level_must_be_an_integer_whatever_nvte_debug(fakes, monkeypatch, level, debug):
    """An empty NVTE_DEBUG_LEVEL read as 0, and "x" passed unless NVTE_DEBUG=1."""
    if debug is None:
        monkeypatch.delenv("NVTE_DEBUG", raising=False)
    else:
        monkeypatch.setenv("NVTE_DEBUG", debug)
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", level)
    with pytest.raises(ValueError, match=f"NVTE_DEBUG_LEVEL must be an integer.*got {level!r}"):
        selection.select(PARAMS)


def test_logging_follows_nvte_debug_off_and_back_to_an_earlier_level(fakes, monkeypatch, fresh_logger):
    """NVTE_DEBUG=0 after 1 kept the handler and the INFO level; going back to a level seen before (an environment
    the choice's cache knew) left the logger at the last one. Turned off, the logger gets the app's level back."""
    logger = fresh_logger
    handlers = list(logger.handlers)
    logger.setLevel(logging.ERROR)   # the app's level before NVTE_DEBUG=1
    monkeypatch.setenv("NVTE_DEBUG", "1")
    for level, expected in (("1", logging.INFO), ("0", logging.WARNING), ("1", logging.INFO)):
        monkeypatch.setenv("NVTE_DEBUG_LEVEL", level)
        selection.select(PARAMS)
        assert logger.level == expected
    assert len(logger.handlers) == len(handlers) + 1
    monkeypatch.setenv("NVTE_DEBUG", "0")
    selection.select(PARAMS)
    assert logger.handlers == handlers and logger.level == logging.ERROR   # the logger left to the app again
    monkeypatch.setenv("NVTE_DEBUG", "1")
    selection.select(PARAMS)
    logger.setLevel(logging.CRITICAL)   # the app's own level, set since: kept, then and when NVTE_DEBUG goes off
    selection.select(PARAMS)
    assert logger.level == logging.CRITICAL
    monkeypatch.delenv("NVTE_DEBUG")
    selection.select(PARAMS)
    assert logger.handlers == handlers and logger.level == logging.CRITICAL


@pytest.mark.parametrize("name", ["NVTE_DEBUG", "NVTE_ALLOW_NONDETERMINISTIC_ALGO"])
@pytest.mark.parametrize("value", ["true", "false", "2", ""])
def test_debug_and_determinism_variables_take_0_or_1(name, value, monkeypatch):
    """As the backend switches: NVTE_DEBUG=true logged nothing and NVTE_ALLOW_NONDETERMINISTIC_ALGO=false left
    non-deterministic algorithms allowed, silently."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"environment variable {name} must be 0 or 1"):
        if name == "NVTE_DEBUG":
            selection.configure_logging()
        else:
            module()
    monkeypatch.setenv(name, "0")
    selection.configure_logging()
    assert name == "NVTE_DEBUG" or module().deterministic


def test_real_registry_on_cpu_explains_fused_and_flash():
    """On this CPU-only machine (or any machine) the reasons are honest strings."""
    attn = module()
    q, k, v = make_inputs()
    text = attn.explain(q.half(), k.half(), v.half()) if torch.cuda.is_available() else attn.explain(q, k, v)
    assert "Selected backend:" in text
    if not torch.cuda.is_available():
        flash2 = text.split("flash2 is not supported because:")[1].split("is not supported because:")[0]
        assert "needs CUDA" in flash2 and "needs a cuda device" not in flash2   # the missing CUDA said once


def test_python_m_attention_reports_backends():
    from attention.__main__ import report

    text = report()
    assert "torch:" in text and "unfused  available" in text


def test_python_m_attention_reports_the_environment_switches(monkeypatch):
    from attention.__main__ import report

    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    assert "unfused  off in the automatic walk (NVTE_* switch); available" in report()
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "off")
    with pytest.raises(ValueError, match="NVTE_UNFUSED_ATTN must be 0 or 1"):
        report()


@pytest.mark.parametrize("raw", [True, False], ids=["raw-environ", "os.environ"])
def test_env_snapshot_reads_what_os_environ_holds(raw: bool, monkeypatch) -> None:
    """The fast read (CPython's bytes mapping behind os.environ) and the portable one agree: unset,
    empty and set values, changed between calls."""
    from attention import environment

    if not raw:
        monkeypatch.setattr(environment, "_RAW_ENVIRON", None)
    elif environment._RAW_ENVIRON is None:
        pytest.skip("no raw environ mapping on this platform")
    names = selection._ENV_NAMES
    for name in names:
        monkeypatch.delenv(name, raising=False)
    assert selection.env_snapshot() == (None,) * len(names)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    monkeypatch.setenv("NVTE_DEBUG", "")
    expected = tuple(os.environ.get(name) for name in names)
    assert selection.env_snapshot() == expected and expected[names.index("NVTE_DEBUG")] == ""
    assert environment.getenv("NVTE_FUSED_ATTN") == "0" and environment.getenv("NVTE_UNSET_HERE", "x") == "x"
    monkeypatch.delenv("NVTE_FUSED_ATTN")
    assert selection.env_snapshot()[names.index("NVTE_FUSED_ATTN")] is None


@pytest.mark.parametrize("raw", [True, False], ids=["raw-environ", "os.environ"])
@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_token_reader_tokens_change_with_the_values(raw: bool, count: int, monkeypatch) -> None:
    """Cache-key tokens of environment variables: equal exactly when the values are (unset, empty, set, changed);
    from four names on, every one unset reads as () (one disjointness test)."""
    from attention import environment

    if not raw:
        monkeypatch.setattr(environment, "_RAW_ENVIRON", None)
    elif environment._RAW_ENVIRON is None:
        pytest.skip("no raw environ mapping on this platform")
    names = tuple(f"ATTN_TEST_TOKEN_{letter}" for letter in "ABCDEFGH")[:count]
    for name in names:
        monkeypatch.delenv(name, raising=False)
    read = environment.token_reader(*names)
    unset = read()
    seen = {unset: (None,) * count}
    for value in ("", "0", "1", "true", "1"):
        monkeypatch.setenv(names[-1], value)
        values = tuple(os.environ.get(name) for name in names)
        assert seen.setdefault(read(), values) == values
    assert len(seen) == 5 and len(read()) == count
    monkeypatch.delenv(names[-1])
    assert read() == unset

