"""`DecodingStepper` on a causal LM (#52): what its panels hold at each step.

The model is the tiny windowed Gemma of `tests/causal_lms.py` (layer 0 a
3-slot ring, layer 1 a full cache) with our attention swapped in; the
session's own numbers are checked against KerasHub in
`tests/models/causal_decoding_test.py`. Here: the widget shows the session's
state (every row, the cache slots, the model view), its controls move the
session (Next, Back, Reset, a forced candidate, a click on the model view)
and the export replays it.
"""

import numpy as np
import pytest

from keras_attention.interchange import keras_hub_models as conversion
from keras_attention.widgets import DecodingStepper
from keras_attention.widgets import decoding_stepper
from tests import causal_lms

keras_hub = pytest.importorskip("keras_hub")
pytest.importorskip("sentencepiece")
MAX_LENGTH = 12


@pytest.fixture(scope="module")
def lm():
    causal_lm = causal_lms.gemma_causal_lm(0, MAX_LENGTH, sliding_window=3)
    conversion.replace_keras_hub_attention(causal_lm)
    return causal_lm


def _columns(source):
    return {key: list(values) for key, values in source.data.items()}


def assert_shows_the_session(stepper):
    """The alignment rows, the cache panel and the model view are the session's."""
    history, columns = stepper.history, len(stepper.source_tokens)
    layer, head = stepper._choice()
    alignment = _columns(stepper.heatmap_source)
    assert len(alignment["weight"]) == len(history) * columns
    for row, step in enumerate(history):
        drawn = alignment["weight"][row * columns : (row + 1) * columns]
        context = len(step.context_tokens)
        expected = decoding_stepper.select(step.attention, layer, head)
        np.testing.assert_allclose(drawn[:context], expected, atol=1e-6)
        assert not any(drawn[context:])  # nothing after the query token
    if not history:
        return
    step = history[-1]
    labels = stepper.heatmap_figure.xaxis[0].major_label_overrides
    assert [labels[i] for i in range(len(step.context_tokens))] == step.context_tokens
    cache = _columns(stepper.cache_source)
    for index, view in enumerate(step.caches):
        cells = [i for i, row in enumerate(cache["row"]) if row == index]
        assert [cache["position"][i] for i in cells] == list(view.positions)
        written = [cache["col"][i] for i in cells if cache["state"][i] == "written"]
        assert written == [view.written_slot]
    heads = _columns(stepper.heads_source)
    num_heads = step.attention.shape[1]
    for layer_index in range(step.attention.shape[0]):
        for head_index in range(num_heads):
            row = layer_index * num_heads + head_index
            drawn = [w for r, w in zip(heads["row"], heads["weight"], strict=True) if r == row]
            np.testing.assert_allclose(
                drawn[: len(step.context_tokens)],
                step.attention[layer_index, head_index],
                atol=1e-6,
            )


def test_the_widget_follows_greedy_decoding_to_generates_text(lm, fake_comm):
    stepper = DecodingStepper(lm, "keras", max_length=MAX_LENGTH, top_k=3)
    assert stepper.cache_figure.visible is False  # nothing to show before a step
    while stepper.next_token() is not None:
        assert_shows_the_session(stepper)
    assert stepper.output_text == lm.generate("keras", max_length=MAX_LENGTH)
    assert stepper.cache_figure.visible and stepper.next_button.disabled
    # Layer 0's ring holds the last 3 positions; layer 1 every one.
    views = stepper.history[-1].caches
    assert len(views[0].positions) == 3 and len(views[1].positions) == MAX_LENGTH


def test_back_reset_force_and_a_click_on_the_model_view(lm, fake_comm):
    stepper = DecodingStepper(lm, "keras", max_length=MAX_LENGTH, top_k=3)
    for _ in range(4):
        stepper.next_token()
    line = [s.token for s in stepper.history]
    stepper.back()
    assert stepper.position == 3 and [s.token for s in stepper.history] == line[:3]
    assert_shows_the_session(stepper)
    stepper.next_token()  # the line is replayed, not decoded again
    assert [s.token for s in stepper.history] == line
    alternative = stepper.history[-1].candidates[1][0]
    stepper.candidate_buttons[1].click()
    assert stepper.history[-1].token == alternative and stepper.history[-1].forced
    assert "(forced)" in stepper.candidate_figure.title.text
    assert_shows_the_session(stepper)
    # A click on the model view's row of layer 1, head 0 shows that head above.
    stepper.heads_source.selected.indices = [
        stepper.heads_source.data["row"].index(2)  # layer 1 x 2 heads + head 0
    ]
    assert stepper._choice() == (1, 0) and "layer 1, head 0" in stepper.heatmap_figure.title.text
    assert_shows_the_session(stepper)
    stepper.show(decoding_stepper.ROLLOUT)
    np.testing.assert_allclose(
        stepper.distribution_source.data["weight"][: len(stepper.history[-1].rollout)],
        stepper.history[-1].rollout,
    )
    stepper.reset()
    assert stepper.history == [] and stepper.output_text == "keras"
    assert_shows_the_session(stepper)
    with pytest.raises(ValueError, match="DecodingStepper.show.*layer=7"):
        stepper.show(7)


def test_the_export_replays_every_step_with_its_cache(lm, fake_comm):
    stepper = DecodingStepper(lm, "keras", max_length=MAX_LENGTH)
    for _ in range(5):
        stepper.next_token()
    document = stepper.standalone_layout()
    callback = next(m for m in document.models if getattr(m, "name", None) == "swap_frame")
    frames = callback.args["frames"]
    # Every step x (2 layers + rollout) x (mean + 2 heads).
    assert len(frames) == 5 * 3 * 3
    last = frames["5|1|0"]
    assert last["data"]["cache_source"] == decoding_stepper.cache_data(
        stepper.history[-1].caches, stepper.history[-1].context_tokens
    )


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        (dict(), ValueError, "DecodingStepper: a causal LM needs `max_length`"),
        (dict(max_length=MAX_LENGTH, top_k=0), ValueError, "top_k=0"),
        (dict(max_length=1), ValueError, "DecodingStepper: .*max_length=1"),
        (
            dict(max_length=MAX_LENGTH, sampler="warm"),
            ValueError,
            "DecodingStepper: .*sampler='warm'",
        ),
    ],
)
def test_bad_arguments_name_the_stepper(lm, fake_comm, arguments, error, match):
    with pytest.raises(error, match=match):
        DecodingStepper(lm, "keras", **arguments)


def test_translator_arguments_are_refused_for_causal_only_options(fake_comm):
    from fake_translator import FakeTranslator

    with pytest.raises(ValueError, match="DecodingStepper: `max_length` is for causal"):
        DecodingStepper(FakeTranslator(), "il a", max_length=8)


def _run(stepper):
    while stepper.next_token() is not None:
        pass
    return stepper.output_text


def test_sampling_controls_decode_with_their_seeded_sampler(lm, fake_comm):
    from keras_attention.models import CausalDecodingSession
    from keras_attention.models import Sampling

    stepper = DecodingStepper(lm, "keras", max_length=MAX_LENGTH)
    stepper.temperature.value = 1.5
    stepper.seed.value = 3
    stepper.decoding_choice.value = "sample"
    assert stepper.session.sampler.temperature == 1.5 and stepper.session.sampler.seed == 3
    expected = CausalDecodingSession(
        lm, "keras", max_length=MAX_LENGTH, sampler=Sampling(temperature=1.5, seed=3)
    ).run()
    for _ in range(4):
        stepper.next_token()
    stepper.back()
    stepper.standalone_layout()  # replays the line, then must leave the session at step 3
    assert [s.token for s in stepper.history] == [s.token for s in expected[:3]]
    _run(stepper)
    assert [s.token for s in stepper.history] == [s.token for s in expected]
    assert any(s.sampled and s.token != s.candidates[0][0] for s in stepper.history)
    stepper.decoding_choice.value = "greedy"
    assert stepper.session.sampler is None and stepper.history == []
    assert _run(stepper) == lm.generate("keras", max_length=MAX_LENGTH)


def test_the_cache_panel_marks_sink_slots_empty_slots_and_the_slot_just_written():
    from keras_attention.models import CacheView

    view = CacheView(np.array([0, 1, 14, 12, -1]), written_slot=2, sink_tokens=2, window=3)
    tokens = [f"t{i}" for i in range(15)]
    data = decoding_stepper.cache_data([view], tokens)
    assert data["state"] == ["sink", "sink", "written", "held", "empty"]
    assert data["token"] == ["t0", "t1", "t14", "t12", ""]
    assert data["color"][0] == decoding_stepper.CACHE_COLORS["sink"]
