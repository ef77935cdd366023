"""The llama.cpp runtime profile travels in the model spec (`model@key=value`, `model@exact`): parsed
and checked up front, handed to the backend, and never read from the environment."""
import pytest

from ctrlsim.backends.llamacpp.profile import RuntimeProfile, split_profile
from ctrlsim.backends.spec_check import check_llm_spec, llm_cache_uses
from ctrlsim.errors import ConfigError

EXACT = dict(kv_reuse=False, flash_attn=False, kv_streams=False, n_parallel=16, n_ctx=8192,
             n_gpu_layers=0, kv_host_mb=2048)
FAST = {**EXACT, "kv_reuse": True, "flash_attn": True, "kv_streams": True}  # the default profile


def test_a_spec_without_settings_has_no_profile():
    for target in ("qwen2.5-0.5b", "qwen2.5-0.5b@bf16", "org/name@main", "/models/a@b.gguf",
                   "http://user:pw@host:9/v1?api_key=x#m", "/data/a@run=1/model.gguf"):
        assert split_profile(target) == (target, None)


def test_settings_and_profiles_are_read_from_the_right():
    assert split_profile("qwen2.5-0.5b@exact") == ("qwen2.5-0.5b", RuntimeProfile(**EXACT))
    assert split_profile("qwen2.5-0.5b@fast") == ("qwen2.5-0.5b", RuntimeProfile(**FAST))
    model, profile = split_profile("qwen2.5-0.5b@bf16@exact@kv_reuse=1,flash_attn=on@n_parallel=4")
    assert model == "qwen2.5-0.5b@bf16"
    assert profile == RuntimeProfile(**{**EXACT, "kv_reuse": True, "flash_attn": True, "n_parallel": 4})
    # settings without a profile name change the default profile (fast)
    assert split_profile("qwen2.5-0.5b@kv_streams=0")[1] == RuntimeProfile(**{**FAST, "kv_streams": False})
    # written left to right, a later setting wins
    assert split_profile("m.gguf@exact@n_parallel=2@n_parallel=3")[1].n_parallel == 3
    # what a profile changes from exact (the default when no other is given)
    assert split_profile("/x/m.gguf@exact@n_gpu_layers=-1")[1].differences() == {"n_gpu_layers": -1}
    assert split_profile("/x/m.gguf@n_gpu_layers=-1")[1].differences() == \
        {"kv_reuse": True, "flash_attn": True, "kv_streams": True, "n_gpu_layers": -1}


@pytest.mark.parametrize("spec, message", [
    ("qwen2.5-0.5b@foo=1", "unknown runtime setting 'foo=1'"),
    ("qwen2.5-0.5b@kv_reuse=2", "kv_reuse must be 0 or 1"),
    ("qwen2.5-0.5b@n_parallel=many", "n_parallel must be an integer"),
    ("qwen2.5-0.5b@n_parallel=0", r"n_parallel must be an integer >= 1, got 0"),
    ("qwen2.5-0.5b@n_ctx=100", r"n_ctx must be an integer >= 256"),
    ("qwen2.5-0.5b@n_gpu_layers=-2", "n_gpu_layers must be an integer -1"),
    ("qwen2.5-0.5b@kv_host_mb=-1", "kv_host_mb must be an integer >= 0"),
    ("qwen2.5-0.5b@n_parallel=1@exact", "the profile comes before every key=value setting"),
    ("qwen2.5-0.5b@exact@exact", "name one runtime profile"),
    ("qwen2.5-0.5b@fastest", "unknown quantization or runtime profile 'fastest'"),
    ("transformers:qwen2.5-0.5b@kv_reuse=1", "runtime settings .* run on llama.cpp only"),
])
def test_a_bad_setting_is_refused_before_anything_loads(spec, message):
    with pytest.raises(ConfigError, match=message):
        check_llm_spec(spec)


def test_the_cache_a_spec_uses_ignores_its_settings():
    assert llm_cache_uses("qwen2.5-0.5b@kv_reuse=1") == llm_cache_uses("qwen2.5-0.5b")
    assert llm_cache_uses("qwen2.5-0.5b@bf16@n_parallel=1") == llm_cache_uses("qwen2.5-0.5b@bf16")


@pytest.mark.llm
def test_the_spec_reaches_the_backend_and_the_environment_does_not(monkeypatch):
    pytest.importorskip("llama_cpp")
    from ctrlsim.backends import load_llm

    # The switches of earlier versions change nothing now: a recorded number depends on the spec.
    for name in ("CTRLSIM_KV_REUSE", "CTRLSIM_FLASH_ATTN", "CTRLSIM_KV_STREAMS", "CTRLSIM_N_PARALLEL",
                 "CTRLSIM_N_CTX", "CTRLSIM_GPU_LAYERS", "CTRLSIM_KV_HOST_MB"):
        monkeypatch.setenv(name, "1")
    plain = load_llm("smollm2-135m")
    assert {k: getattr(plain, k) for k in FAST} == FAST
    exact = load_llm("smollm2-135m@exact")
    assert {k: getattr(exact, k) for k in EXACT} == EXACT
    tuned = load_llm("smollm2-135m@kv_reuse=1,flash_attn=1,kv_streams=1@n_parallel=4@n_ctx=4096@kv_host_mb=0")
    assert (tuned.kv_reuse, tuned.flash_attn, tuned.kv_streams) == (True, True, True)
    assert (tuned.n_parallel, tuned.n_ctx, tuned.kv_host_mb) == (4, 4096, 0)
    assert tuned.model_id == plain.model_id == "smollm2-135m"  # the model is named without its settings
    assert not tuned.loaded and not plain.loaded


def test_a_run_with_a_bad_setting_fails_before_any_unit(tmp_path):
    import ctrlsim
    from ctrlsim.experiments.config import RunOptions
    from ctrlsim.experiments.steereval.config import SteerEvalConfig

    with pytest.raises(ConfigError, match="unknown runtime setting"):
        ctrlsim.run("steereval", config=SteerEvalConfig(llm="smollm2-135m@kv_reuse=1,turbo=1", users=2),
                    options=RunOptions(out=str(tmp_path / "run")), show_progress=False)
    assert not (tmp_path / "run" / "records.jsonl").exists()


@pytest.mark.llm
def test_every_setting_that_can_change_a_reply_is_in_the_identity_and_the_cache_key():
    """Constructed, not loaded (weights load on the first call): `exact` names nothing, so its
    records and cache keys are those of runs made before profiles; any other setting is named."""
    pytest.importorskip("llama_cpp")
    from ctrlsim.backends import load_llm

    exact = load_llm("smollm2-135m@exact")
    assert not {"kv_reuse", "n_parallel", "n_ctx", "flash_attn", "kv_streams"} & set(exact.identity)
    tuned = load_llm("smollm2-135m@exact@kv_reuse=1,n_parallel=4,n_ctx=4096")
    assert {k: tuned.identity[k] for k in ("kv_reuse", "n_parallel", "n_ctx")} == \
        {"kv_reuse": True, "n_parallel": 4, "n_ctx": 4096}
    assert tuned.cache_identity() == exact.cache_identity() + ":kv_reuse=1:n_parallel=4:n_ctx=4096"
    for spec in ("smollm2-135m@exact@kv_reuse=1", "smollm2-135m@exact@n_parallel=1",
                 "smollm2-135m@exact@kv_streams=1"):
        assert load_llm(spec).cache_identity() != exact.cache_identity(), spec
    # the default (fast) profile names its three settings in the identity and the cache key
    default = load_llm("smollm2-135m")
    assert {k: default.identity[k] for k in ("kv_reuse", "flash_attn", "kv_streams")} == \
        {"kv_reuse": True, "flash_attn": True, "kv_streams": True}
    assert default.cache_identity() == exact.cache_identity() + ":flash:kv_streams=1:kv_reuse=1"
