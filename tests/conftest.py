import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Imported after the line above: TensorFlow reads TF_CPP_MIN_LOG_LEVEL at import.
import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts with the default dtype policy, a fresh name scope and
    the environment the session started with (the examples, run in-process by
    their tests, set KERAS_ATTENTION_QUIET_STARTUP; a later test's subprocess
    that imports keras first then warned, as a user's script should)."""
    environment = dict(os.environ)
    yield
    for name in set(os.environ) - set(environment):
        del os.environ[name]
    os.environ.update(environment)
    keras.config.set_dtype_policy("float32")
    # Without the full `gc.collect()` Keras runs by default: with TensorFlow or
    # JAX loaded and a worker's earlier files alive, one collection took 0.2-1 s,
    # and the teardowns were 44% of `make test`'s time (2026-12-05 clean run:
    # TensorFlow 1182 s of 2850, JAX 905 of 1810). Python's own collector still
    # frees the cycles; a worker's peak memory was the same (1.07 GB) either way.
    keras.backend.clear_session(free_memory=False)


@pytest.fixture(autouse=True, scope="session")
def _watch_browser_pages():
    """Every browser page any test opens (module fixtures' too) records its errors."""
    try:
        from playwright.sync_api import Browser
        from playwright.sync_api import BrowserContext
    except ImportError:
        yield
        return
    from tests import page_errors

    with pytest.MonkeyPatch.context() as patch:
        for owner in (Browser, BrowserContext):

            def new_page(self, *args, _original=owner.new_page, **kwargs):
                return page_errors.watch(_original(self, *args, **kwargs))

            patch.setattr(owner, "new_page", new_page)
        yield


@pytest.fixture(autouse=True)
def _fail_on_page_errors(_watch_browser_pages):
    """A test fails on any page error or BokehJS error of a page open while it ran."""
    yield
    from tests import page_errors

    errors = collections.Counter(page_errors.take())
    if errors:
        lines = [f"{count} x {error}" for error, count in errors.most_common(20)]
        pytest.fail("errors in the browser page:\n" + "\n".join(lines), pytrace=False)


@pytest.fixture(scope="module")
def trained_translator(tmp_path_factory):
    """Whitespace-tokenized number words -> digits, trained for a few seconds."""
    from tests.translator_fixtures import train_translator
    from tests.translator_fixtures import trained_once

    return trained_once(tmp_path_factory, "trained_translator", train_translator)


@pytest.fixture(scope="module")
def trained_transformer(tmp_path_factory):
    """The same task for a small `TransformerTranslator`."""
    from tests.translator_fixtures import train_transformer
    from tests.translator_fixtures import trained_once

    return trained_once(tmp_path_factory, "trained_transformer", train_transformer)


def _is_layer_detail(item):
    """A tests/layers test other than a layer's contract, the family checks and
    the tests marked `both_backends`."""
    path = item.path.as_posix()
    return (
        "/tests/layers/" in path
        and not path.endswith("/layer_family_test.py")
        and not item.originalname.startswith("test_layer_contract")
        and item.get_closest_marker("both_backends") is None
    )


# Test files whose tests take longest in all (seconds, setup included: the
# 2026-12-05 clean-clone `.ci/run` on 2 cores after #35's speed-ups, from
# `--durations=0`; the export figure before its requests shared one serving
# process). They are collected first, so that with `--dist loadfile
# --no-loadscope-reorder` (the Makefile's) one worker starts each while the
# other works through the short files, instead of one starting last with the
# other idle; xdist's own reorder (by number of tests) put the browser tests,
# ~30 tests in ~5 minutes, near the end. Files not listed keep their
# collection order after these.
LONG_FILES = [
    "tests/export/export_test.py",  # 344
    # Not in that run (#51): 75-100 s alone on the 2 busy cores of 2026-12-06
    # (about 30 s of CPU); one fresh serving process, one export, two XLA generates.
    "tests/export/causal_lm_export_test.py",
    # Since 2026-12-06: 23 pages, not 27 (Voila's light walk on the shipped notebook's
    # page; LiveAttention and the explorer on one page per front end), each finished
    # kernel stopped at once (its exit: 1.3-2.5 s -> 0.13 s a page). Since 2026-12-07
    # `make test` opens 8 of them (one per test; `make test-browsers` all 23).
    "tests/widgets/frontends_test.py",  # 311
    "tests/packaging/wheel_test.py",  # 141
    "tests/distribution/tf_distribution_test.py",  # 98
    "tests/layers/long_sequence_task_test.py",  # 73
    "tests/widgets/notebooks_test.py",  # 70
    "tests/layers/precision_training_test.py",  # 67, JAX 31
    "tests/examples/phrase_translation_test.py",  # 54
    "tests/packaging/quiet_startup_test.py",  # 52
    "tests/models/seq2seq_translator_test.py",  # 49
    "tests/examples/distributed_training_test.py",  # 46
    "tests/models/keras_saving_test.py",  # 39
    "tests/docs/readme_test.py",  # 38
    # Not listed before 2026-12-06 (its run: 1003 s): the ring worker's setup
    # alone took 31 s there (38 s of CPU, alone, on 2026-12-06).
    "tests/distribution/ring_attention_test.py",  # 35
    "tests/distribution/jax_distribution_test.py",  # 34
    # The longest of `make test-jax` (the same run), long on TensorFlow too.
    "tests/layers/sparse_attention_test.py",  # JAX 47
    "tests/layers/combinations_test.py",  # JAX 46
    "tests/layers/fuzz_test.py",  # JAX 44, TF 31
    "tests/layers/multi_head_attention_test.py",  # JAX 43
    "tests/ops/block_sparse_test.py",  # JAX 42
    "tests/keras_hub/family_parity_test.py",  # JAX 84 (KerasHub's layers op by op)
    # Not listed before 2026-12-06: its tests' calls summed 40 s on JAX that day
    # (alone, loaded machine; Gemma 3's generate 13 s), TensorFlow too.
    "tests/keras_hub/mask_rules_test.py",  # JAX ~35
    "tests/keras_hub/keras_hub_substitution_test.py",  # JAX 37
    "tests/keras_ported/keras_multi_head_attention_test.py",  # JAX 29
    "tests/layers/wrapped_call_test.py",  # JAX 26
    "tests/ops/kernel_contract_test.py",  # JAX 24, TF 27
]


def _long_first(item):
    path = item.path.as_posix()
    for rank, name in enumerate(LONG_FILES):
        if path.endswith("/" + name):
            return rank
    return len(LONG_FILES)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_layer_detail(item):
            item.add_marker(pytest.mark.layer_detail)
    items.sort(key=_long_first)  # stable: each file's tests stay in order
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason="needs the TensorFlow backend")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)
