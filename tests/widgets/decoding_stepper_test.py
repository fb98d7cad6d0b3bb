import pathlib

import numpy as np
import pytest

from keras_attention.widgets import DecodingStepper
from tests.widgets.fake_translator import FakeTranslator

SOURCE = "il a m' entarté"


def rows_of(source, num_source):
    """The heatmap source as a (rows, T_in) matrix, checking row-major cell order."""
    data = source.data
    weights = np.asarray(data["weight"]).reshape(-1, num_source)
    rows = np.asarray(data["row"]).reshape(-1, num_source)
    cols = np.asarray(data["col"]).reshape(-1, num_source)
    assert (rows == np.arange(len(rows))[:, None]).all()
    assert (cols == np.arange(num_source)[None, :]).all()
    return weights


def test_next_grows_the_heatmap_by_the_sessions_attention_row(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    assert len(stepper.heatmap_source.data["weight"]) == 0
    for expected_rows in (1, 2, 3):
        step = stepper.next_token()
        matrix = rows_of(stepper.heatmap_source, 4)
        assert matrix.shape == (expected_rows, 4)
        np.testing.assert_allclose(matrix[-1], step.attention)
        assert stepper.heatmap_source.data["y_token"][-1] == step.token
    assert stepper.step_slider.value == 3
    np.testing.assert_allclose(stepper.distribution_source.data["weight"], step.attention)
    np.testing.assert_allclose(stepper.scores_source.data["weight"], step.scores)
    assert stepper.candidate_source.data["token"] == [t for t, _ in step.candidates]


def test_next_uses_stream_so_only_the_new_row_goes_over_the_comm(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    comm = stepper.bokeh_widget.comm
    before = len(comm.messages)
    stepper.next_token()
    payloads = [str(message) for message in comm.messages[before:]]
    assert any("ColumnsStreamed" in p for p in payloads)
    assert any("ColumnsPatched" in p for p in payloads)
    assert not any("ModelChanged" in p and '"attr":"data"' in p for p in payloads), "no full resend"


def echo_to_kernel(widget, events):
    """What jupyter_bokeh's page does with each change the kernel sends: applies it, then
    sends it back to the kernel as if the page had made it."""
    from bokeh.core.serialization import Serializer

    serializer = Serializer(references=set(widget._document.models))
    sent = [event for event in events if event.setter is not widget]  # not the echoes' own
    events.clear()
    for event in sent:
        widget._sync_model(widget, {**serializer.encode(event), "event": "jsevent"}, [])


def test_the_pages_echo_of_a_change_leaves_the_kernels_sources_as_drawn(fake_comm):
    # The echo of a stream appended its rows again in the kernel, whose next frame then
    # patched rows the page never had: blank alignment rows after Reset or Back (#42).
    stepper = DecodingStepper(FakeTranslator(max_length=6), SOURCE)
    events = []
    stepper.bokeh_widget._document.on_change(lambda event: events.append(event))
    view = DecodingStepper(FakeTranslator(max_length=6), SOURCE)  # the same steps, no page
    actions = [("reset",), *[("next_token",)] * 6, ("back",), ("next_token",), ("back",)]
    actions += [("go_to", 1), ("force", "pie"), ("go_to", 5)]
    for name, *arguments in actions:
        getattr(stepper, name)(*arguments)
        getattr(view, name)(*arguments)
        echo_to_kernel(stepper.bokeh_widget, events)
        for source in ("heatmap_source", "distribution_source", "candidate_source"):
            drawn, expected = getattr(stepper, source).data, getattr(view, source).data
            assert {k: list(v) for k, v in drawn.items()} == {
                k: list(v) for k, v in expected.items()
            }, (name, arguments, source)


def test_back_and_reset_restore_earlier_states(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    stepper.next_token()
    after_one = {k: list(v) for k, v in stepper.heatmap_source.data.items()}
    distribution_after_one = list(stepper.distribution_source.data["weight"])
    stepper.next_token()
    stepper.next_token()
    stepper.back()
    stepper.back()
    assert stepper.position == 1 and len(stepper.session.history) == 1
    for column in ("weight", "row", "col", "y_token"):
        assert list(stepper.heatmap_source.data[column]) == list(after_one[column])
    assert list(stepper.distribution_source.data["weight"]) == pytest.approx(distribution_after_one)
    # The line decoded before Back is kept: the slider can go forward again.
    assert stepper.step_slider.max == 3
    stepper.reset()
    assert stepper.position == 0 and stepper.session.history == []
    assert len(stepper.heatmap_source.data["weight"]) == 0
    assert stepper.step_slider.max == 0 and stepper.back_button.disabled


def test_buttons_drive_the_same_actions(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    stepper.next_button.click()
    stepper.next_button.click()
    stepper.back_button.click()
    assert stepper.position == 1
    stepper.reset_button.click()
    assert stepper.position == 0


def test_slider_replays_the_decoded_line(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    steps = [stepper.next_token() for _ in range(3)]
    stepper.step_slider.value = 1
    assert [s.token for s in stepper.session.history] == [steps[0].token]
    stepper.step_slider.value = 3
    assert [s.token for s in stepper.session.history] == [s.token for s in steps]
    np.testing.assert_allclose(rows_of(stepper.heatmap_source, 4), [s.attention for s in steps])


def test_clicking_a_candidate_forces_it_and_decodes_on(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    first = stepper.next_token()
    alternative = first.candidates[1][0]
    assert stepper.candidate_buttons[1].description.startswith(alternative)
    stepper.candidate_buttons[1].click()
    assert stepper.session.output_tokens == [alternative]
    assert stepper.position == 1 and len(rows_of(stepper.heatmap_source, 4)) == 1
    following = stepper.next_token()
    assert stepper.session.output_tokens == [alternative, following.token]
    # An independent session fed the same tokens agrees with what is shown.
    reference = FakeTranslator().decoding_session(SOURCE)
    reference.step(force_token=alternative)
    np.testing.assert_allclose(reference.step().attention, rows_of(stepper.heatmap_source, 4)[-1])


def test_play_ticks_decode_until_done_then_stop(fake_comm):
    stepper = DecodingStepper(FakeTranslator(max_length=4), SOURCE)
    stepper.speed.value = 4.0
    assert stepper.play.interval == 250
    stepper.play.playing = True
    for tick in range(1, 10):
        stepper.play.value = tick  # what the browser's Play widget does on each interval
    assert stepper.session.done and not stepper.play.playing
    assert stepper.position == len(stepper.session.history) <= 4
    assert stepper.next_token() is None and "finished" in stepper.status_html.value


def test_transformer_attention_is_shown_per_layer_and_head(fake_comm):
    stepper = DecodingStepper(FakeTranslator(heads=(2, 3)), "a b c")
    step = stepper.next_token()
    stepper.next_token()
    assert stepper.layer_choice.layout.display is None
    assert list(stepper.head_choice.options)[1:] == [0, 1, 2]
    np.testing.assert_allclose(
        rows_of(stepper.heatmap_source, 3)[0], step.attention[-1].mean(axis=0)
    )
    stepper.layer_choice.value = 0
    stepper.head_choice.value = 2
    matrix = rows_of(stepper.heatmap_source, 3)
    np.testing.assert_allclose(matrix, [s.attention[0, 2] for s in stepper.session.history])


def test_malicious_tokens_are_escaped_in_html_widgets(fake_comm):
    translator = FakeTranslator()
    stepper = DecodingStepper(translator, "<b>bold</b> b")
    assert "<b>bold" not in stepper.source_html.value
    assert "&lt;b&gt;bold&lt;/b&gt;" in stepper.source_html.value
    stepper.next_token()
    stepper.force("<img src=x onerror=alert(1)>")
    assert "<img" not in stepper.output_html.value
    assert "&lt;img src=x onerror=alert(1)&gt;" in stepper.output_html.value


def test_each_stage_has_a_panel_titled_with_the_step_and_its_token(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    stepper.next_token()
    step = stepper.next_token()
    titles = [
        stepper.scores_figure.title.text,
        stepper.distribution_figure.title.text,
        stepper.weighted_sum_figure.title.text,
        stepper.candidate_figure.title.text,
    ]
    assert [title[:2] for title in titles] == ["1.", "2.", "3.", "4."]
    for title in titles:
        assert f"'{step.token}'" in title and "2" in title
    assert (
        f"attention while producing '{step.token}'"
        in stepper.distribution_figure.title.text.lower()
    )
    np.testing.assert_allclose(stepper.scores_source.data["weight"], step.scores)
    # Stage 3: one row per source vector times its weight, then their sum.
    values = stepper.session.values
    rows = rows_of(stepper.weighted_sum_source, values.shape[1])
    np.testing.assert_allclose(rows[:-1], step.attention[:, None] * values)
    np.testing.assert_allclose(rows[-1], step.attention @ values)
    assert stepper.weighted_sum_source.data["y_token"][-1] == "= context"


def test_the_chosen_token_is_marked_in_the_prediction(fake_comm):
    from keras_attention.widgets.figures import CHOSEN_COLOR

    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    first = stepper.next_token()
    colors = stepper.candidate_source.data["color"]
    assert colors[0] == CHOSEN_COLOR and CHOSEN_COLOR not in colors[1:]
    stepper.force(first.candidates[2][0])
    colors = stepper.candidate_source.data["color"]
    assert [i for i, color in enumerate(colors) if color == CHOSEN_COLOR] == [2]
    assert "(forced)" in stepper.candidate_figure.title.text
    # Its whole row is tinted, however short its bar (#42: p ~ 0 drew nothing to see).
    alphas = stepper.candidate_source.data["row_alpha"]
    assert [i for i, alpha in enumerate(alphas) if alpha > 0] == [2]


def test_tapping_a_candidate_bar_forces_it_once(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    first = stepper.next_token()
    forced = []
    original_force = stepper.force
    stepper.force = lambda token: (forced.append(token), original_force(token))[1]
    # What jupyter_bokeh receives when the page's tap tool selects bar 1.
    selected = stepper.candidate_source.selected
    stepper.bokeh_widget._sync_model(
        stepper.bokeh_widget,
        {
            "event": "jsevent",
            "kind": "ModelChanged",
            "model": {"id": selected.id},
            "attr": "indices",
            "new": [1],
        },
        [],
    )
    assert forced == [first.candidates[1][0]]
    assert stepper.session.output_tokens == [first.candidates[1][0]]
    assert selected.indices == []  # ready for the next tap


def test_a_failed_force_leaves_the_state_unchanged(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    steps = [stepper.next_token() for _ in range(2)]
    before = {k: list(v) for k, v in stepper.heatmap_source.data.items()}
    with pytest.raises(ValueError, match="DecodingStepper.force: .*zzzz"):
        stepper.force("zzzz")
    assert stepper.position == 2 and stepper.session.output_tokens == [s.token for s in steps]
    assert {k: list(v) for k, v in stepper.heatmap_source.data.items()} == before
    assert stepper.step_slider.max == 2


def test_reset_clears_the_candidate_labels(fake_comm):
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    stepper.next_token()
    assert any(stepper.candidate_figure.yaxis[0].major_label_overrides.values())
    stepper.reset()
    assert not any(stepper.candidate_figure.yaxis[0].major_label_overrides.values())
    assert stepper.candidate_source.data["token"] == [""] * 5


def test_heatmap_rows_follow_the_output_and_long_sources_stay_narrow(fake_comm):
    source = " ".join(f"w{i}" for i in range(24))
    stepper = DecodingStepper(FakeTranslator(max_length=30), source)
    start_height = stepper.heatmap_figure.height
    assert start_height < 300 and stepper.heatmap_figure.width <= 800
    for _ in range(8):
        stepper.next_token(force_token="he")
    assert stepper.heatmap_figure.height > start_height
    assert stepper.heatmap_figure.y_range.start == 7.5
    assert stepper.bokeh_widget.layout.overflow == "auto"


def test_transformers_without_scores_get_no_scores_panel_and_name_the_head(fake_comm):
    stepper = DecodingStepper(FakeTranslator(heads=(2, 3), with_scores=False), "a b c")
    stepper.next_token()
    assert not stepper.scores_figure.visible
    assert stepper.weighted_sum_figure is None  # no source vectors exposed
    assert stepper.heatmap_figure.title.text.endswith("layer 1, mean of heads")
    stepper.head_choice.value = 2
    assert stepper.heatmap_figure.title.text.endswith("layer 1, head 2")


class NoSessions:
    def translate(self, texts):
        return texts


@pytest.mark.parametrize("translator", [NoSessions(), object()])
def test_translator_without_decoding_sessions_is_rejected(translator, fake_comm):
    with pytest.raises(TypeError, match="supports decoding sessions.*Received: "):
        DecodingStepper(translator, SOURCE)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"text": ""}, "non-empty string"),
        ({"text": 3}, "non-empty string"),
        ({"top_k": 0}, "top_k=0"),
        ({"reserved_rows": 0}, "reserved_rows=0"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, match, fake_comm):
    arguments = {"text": SOURCE, **kwargs}
    with pytest.raises(ValueError, match=match):
        DecodingStepper(FakeTranslator(), **arguments)


@pytest.mark.tf_only
def test_real_translator_heatmap_equals_the_compiled_translation_alignment(fake_comm):
    from keras_attention.models import Seq2SeqTranslator

    translator = Seq2SeqTranslator.from_texts(
        ["il a m' entarté", "il a"],
        ["he hit me with a pie", "he hit"],
        source_split="whitespace",
        target_split="whitespace",
        units=8,
        embedding_dim=4,
        max_target_length=6,
    )
    stepper = DecodingStepper(translator, SOURCE, top_k=3)
    while stepper.next_token() is not None:
        pass
    translation = translator.translate([SOURCE])[0]
    matrix = rows_of(stepper.heatmap_source, len(translation.source_tokens))
    assert stepper.source_tokens == translation.source_tokens
    np.testing.assert_allclose(
        matrix[: len(translation.alignment)], translation.alignment, atol=1e-5
    )


def test_a_front_end_connecting_late_gets_the_current_document(fake_comm):
    # Voila and reloaded notebooks ask for the widget state after the cells ran.
    import json

    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    step = stepper.next_token()
    bundle = json.loads(stepper.bokeh_widget.get_state()["render_bundle"])
    document = json.dumps(bundle["docs_json"])
    assert '"alignment_source"' in document
    assert json.dumps(step.token) in document and str(float(step.attention[0]))[:8] in document


def test_a_page_that_opens_is_answered_from_the_document_serialised_after_the_cell(
    fake_comm, monkeypatch
):
    # Serialising a document takes 0.1-0.8 s a figure; a page asks for every widget's
    # state at once and Voila gives up after 4 s (it then drew one explorer of two).
    # The documents a cell changed are serialised after it (post_execute); a page's
    # request is answered from that, and any later change, the page's too, is new.
    import json

    from keras_attention.widgets import _component

    hooks = []

    class Shell:
        class events:
            register = staticmethod(lambda name, hook: hooks.append((name, hook)))

    monkeypatch.setattr(_component, "_hooked", False)
    monkeypatch.setattr("IPython.get_ipython", lambda: Shell())
    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    assert [name for name, _ in hooks] == ["post_execute"]  # in a kernel, hooked once
    widget = stepper.bokeh_widget
    step = stepper.next_token()
    hooks[0][1]()  # the cell ends
    serialised = []
    original = type(widget)._model_to_traits
    monkeypatch.setattr(
        type(widget),
        "_model_to_traits",
        classmethod(lambda cls, model: serialised.append(1) or original(model)),
    )
    sent = []
    monkeypatch.setattr(widget, "send_state", lambda key=None: sent.append(key))
    widget._on_view_drawn(None)  # a view drawn from the state sent at creation is stale ...
    assert sent == ["render_bundle"]
    bundle = json.loads(widget.get_state()["render_bundle"])  # ... and the page's request
    assert serialised == []  # is answered without serialising again
    assert json.dumps(step.token) in json.dumps(bundle["docs_json"])
    widget._on_view_drawn(None)  # drawn from that state: nothing to resend
    assert sent == ["render_bundle"]
    stepper.next_token()  # a cell steps the drawn view: it follows as patches, and
    hooks[0][1]()  # the cell's end serialises nothing for it
    assert serialised == []
    assert json.loads(widget.get_state()["render_bundle"]) != bundle  # a reload: fresh
    assert serialised == [1]
    # A change the page made (a selection) is in the next state.
    source = stepper.heatmap_source
    widget._document.apply_json_patch(
        {
            "events": [
                {
                    "kind": "ModelChanged",
                    "model": source.selected.ref,
                    "attr": "indices",
                    "new": [2],
                }
            ]
        },
        setter=widget,
    )
    assert source.selected.indices == [2]
    bundle = json.loads(widget.get_state()["render_bundle"])
    assert serialised == [1, 1]


@pytest.mark.tf_only
def test_seq2seq_session_values_are_the_encoder_outputs_attention_sums(fake_comm):
    from keras_attention.models import Seq2SeqTranslator

    translator = Seq2SeqTranslator.from_texts(
        ["il a m' entarté", "il a"],
        ["he hit me with a pie", "he hit"],
        source_split="whitespace",
        target_split="whitespace",
        units=8,
        embedding_dim=4,
    )
    session = translator.decoding_session(SOURCE)
    source_ids, _ = translator.source_text.encode(tf_constant([SOURCE]))
    encoder_outputs, _, _ = translator.encode(source_ids, False)
    assert session.values.shape == (4, encoder_outputs.shape[-1])
    np.testing.assert_allclose(session.values, np.asarray(encoder_outputs)[0, :4], atol=1e-6)
    stepper = DecodingStepper(translator, SOURCE)
    step = stepper.next_token()
    np.testing.assert_allclose(
        rows_of(stepper.weighted_sum_source, session.values.shape[1])[-1],
        step.attention @ session.values,
        atol=1e-5,
    )


def tf_constant(value):
    import tensorflow as tf

    return tf.constant(value)


@pytest.mark.tf_only
def test_transformer_translator_rows_follow_the_layer_and_head_choice(fake_comm):
    from keras_attention.models import TransformerTranslator

    translator = TransformerTranslator.from_texts(
        ["il a m' entarté", "il a"],
        ["he hit me with a pie", "he hit"],
        source_split="whitespace",
        target_split="whitespace",
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_target_length=5,
    )
    stepper = DecodingStepper(translator, SOURCE, top_k=3)
    while stepper.next_token() is not None:
        pass
    alignment = translator.translate([SOURCE])[0].alignment  # (layers, heads, T_out, T_in)
    rows = len(alignment[0, 0])
    assert list(stepper.layer_choice.options) == [0, 1] and list(stepper.head_choice.options)[
        1:
    ] == [0, 1]
    np.testing.assert_allclose(
        rows_of(stepper.heatmap_source, 4)[:rows], alignment[-1].mean(axis=0), atol=1e-5
    )
    stepper.layer_choice.value = 0
    stepper.head_choice.value = 1
    np.testing.assert_allclose(
        rows_of(stepper.heatmap_source, 4)[:rows], alignment[0, 1], atol=1e-5
    )


def test_export_embeds_the_whole_decoded_line_and_leaves_the_widget_alone(fake_comm, tmp_path):
    import json

    from keras_attention.widgets import export_html

    stepper = DecodingStepper(FakeTranslator(), SOURCE)
    steps = [stepper.next_token() for _ in range(3)]
    stepper.back()
    path = export_html(stepper, tmp_path / "stepper.html")
    assert stepper.position == 2 and stepper.step_slider.max == 3
    html = pathlib.Path(path).read_text(encoding="utf-8")
    assert "cdn.bokeh.org" not in html
    for step in steps:
        assert json.dumps(float(step.attention[0]))[:10] in html


def test_export_html_rejects_what_it_cannot_draw(tmp_path):
    from keras_attention.widgets import export_html

    with pytest.raises(TypeError, match="export_html: `obj` must be .* Received: dict"):
        export_html({}, tmp_path / "x.html")


def test_each_panels_range_holds_its_data_at_every_step(fake_comm):
    # Scores reach several units: the scores panel's range is set with them
    # (a range left at its first value clipped every bar to [-1, 1]).
    stepper = DecodingStepper(FakeTranslator(max_length=6), SOURCE)
    for _ in range(4):
        step = stepper.next_token()
        y_range = stepper.scores_figure.y_range
        assert y_range.start <= min(0.0, step.scores.min()) and y_range.end >= max(
            0.0, step.scores.max()
        )
        assert y_range.end - y_range.start <= 1.2 * (
            max(0.0, step.scores.max()) - min(0.0, step.scores.min())
        )
        assert (
            stepper.distribution_figure.y_range.start == 0.0
            and stepper.distribution_figure.y_range.end == 1.0
        )
        # The alignment shows exactly the rows decoded, each labelled with its token.
        rows = stepper.position
        assert (stepper.heatmap_figure.y_range.start, stepper.heatmap_figure.y_range.end) == (
            rows - 0.5,
            -0.5,
        )
        axis = stepper.heatmap_figure.yaxis[0]
        assert axis.ticker.ticks == list(range(rows))
        assert [axis.major_label_overrides[i] for i in range(rows)] == [
            s.token for s in stepper.history
        ]
    assert np.abs(step.scores).max() > 1.0  # the case that was clipped


def test_the_export_embeds_the_frames_the_widget_draws(fake_comm):
    from bokeh.models import CustomJS

    from keras_attention.widgets import decoding_stepper

    stepper = DecodingStepper(FakeTranslator(heads=(2, 3)), "a b c d")
    steps = [stepper.next_token() for _ in range(3)]
    callback = stepper.standalone_layout().select_one({"type": CustomJS, "name": "swap_frame"})
    frames = callback.args["frames"]
    assert len(frames) == 3 * 2 * 4  # steps x layers x (mean + heads)
    for position in (1, 3):
        for layer, head in ((1, "mean of heads"), (0, 2)):
            stepper.go_to(position)
            stepper.layer_choice.value, stepper.head_choice.value = layer, head
            frame = frames[f"{position}|{layer}|{head}"]
            # The very frame the live widget applies for that state.
            live = stepper._view.frame(stepper.history, layer, head, show_choice=True)
            assert frame == live
            np.testing.assert_allclose(
                stepper.heatmap_source.data["weight"], frame["data"]["alignment_source"]["weight"]
            )
            assert stepper.heatmap_figure.title.text == frame["props"]["alignment_title"]["text"]
            expected = [decoding_stepper.select(s.attention, layer, head) for s in steps[:position]]
            np.testing.assert_allclose(
                np.reshape(frame["data"]["alignment_source"]["weight"], (position, 4)), expected
            )
            scores = decoding_stepper.select(steps[position - 1].scores, layer, head)
            y_range = frame["props"]["scores_y_range"]
            assert y_range["start"] <= scores.min() and y_range["end"] >= scores.max()
            assert frame["props"]["alignment_y_axis"]["major_label_overrides"] == {
                i: s.token for i, s in enumerate(steps[:position])
            }


@pytest.mark.tf_only
def test_transformer_stepper_shows_all_four_stages_in_two_rows(fake_comm):
    from keras_attention.models import TransformerTranslator

    translator = TransformerTranslator.from_texts(
        ["il a m' entarté", "il a"],
        ["he hit me with a pie", "he hit"],
        source_split="whitespace",
        target_split="whitespace",
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_target_length=5,
    )
    stepper = DecodingStepper(translator, SOURCE, top_k=3)
    stepper.next_token(force_token="he")  # forced: an untrained model may end at once
    step = stepper.next_token(force_token="hit")
    first_row, second_row = stepper.figures_layout.children[:2]
    assert first_row.children == [stepper.scores_figure, stepper.distribution_figure]
    assert second_row.children == [stepper.weighted_sum_figure, stepper.candidate_figure]
    assert stepper.scores_figure.visible
    values = stepper.session.values  # (layers, heads, T_in, head_dim): the cross-attention's values
    assert values.shape == (2, 2, 4, 4)
    for layer, head in ((1, "mean of heads"), (0, 1)):
        stepper.layer_choice.value, stepper.head_choice.value = layer, head
        scores = np.asarray(stepper.scores_source.data["weight"])
        weights = (
            step.attention[layer].mean(axis=0)
            if head == "mean of heads"
            else step.attention[layer, head]
        )
        np.testing.assert_allclose(stepper.distribution_source.data["weight"], weights, atol=1e-6)
        if head == "mean of heads":
            np.testing.assert_allclose(scores, step.scores[layer].mean(axis=0), atol=1e-6)
            assert "mean of heads" in stepper.scores_figure.yaxis[0].axis_label
            # Every head's weighted values side by side; the last row: each head's context.
            context = np.concatenate(
                [step.attention[layer, h] @ values[layer, h] for h in range(2)]
            )
        else:
            # Stage 1 is what stage 2 is the softmax of.
            softmax = np.exp(scores - scores.max())
            np.testing.assert_allclose(softmax / softmax.sum(), weights, atol=1e-5)
            context = weights @ values[layer, head]
        rows = rows_of(stepper.weighted_sum_source, len(context))
        np.testing.assert_allclose(rows[-1], context, atol=1e-5)
        assert stepper.weighted_sum_figure.x_range.end == len(context) - 0.5
