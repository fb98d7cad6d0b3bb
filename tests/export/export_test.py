import inspect
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attention as ka

pytestmark = pytest.mark.tf_only

TEXTS = ["three one four", "", "nine bonjour two", "one two three four five six seven"]
SIGNATURES = {"serving_default", "greedy", "beam_search"}


@pytest.fixture(scope="module")
def exported(trained_translator, tmp_path_factory):
    from keras_attention.export import export_translator

    path = str(tmp_path_factory.mktemp("export") / "translator")
    export_translator(trained_translator, path, warmup_texts=["one two", ""])
    return path


@pytest.fixture(scope="module")
def exported_transformer(trained_transformer, tmp_path_factory):
    from keras_attention.export import export_translator

    path = str(tmp_path_factory.mktemp("export") / "transformer")
    export_translator(trained_transformer, path, beam_width=4)
    return path


@pytest.fixture(scope="module")
def exported_check(exported):
    """`check_servable(exported)`'s report, and what its fresh serving
    process returned (replayed where only the judging of it is tested)."""
    from keras_attention.export import check

    real, recorded = check.run_in_serving_process, []

    def record(*args, **kwargs):
        recorded.append(real(*args, **kwargs))
        return recorded[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check, "run_in_serving_process", record)
        report = check.check_servable(exported)
    (fresh,) = recorded
    return report, fresh


def _feed(texts, **inputs):
    return {"text": np.array(texts, dtype=object), **inputs}


@pytest.fixture(scope="module")
def served_translator(exported):
    """`{test: (fresh-process report, answers)}` for the requests the tests
    below send to `exported`: one serving process answers them all (a
    process costs ~8 s of CPU to start). Each answer is an outputs dict, or
    the error string of a refused request."""
    from keras_attention.export.check import run_feeds_in_serving_process

    requests = {
        "same_outputs": [
            ("serving_default", _feed(TEXTS)),
            ("beam_search", _feed(TEXTS, beam_width=np.int32(3))),
        ],
        "bad_requests": [
            ("beam_search", _feed(["one"], beam_width=np.int32(9))),
            ("serving_default", {"text": np.array([1, 2], dtype=np.int32)}),
        ],
        "not_1d": [
            (name, {**_rest_feed(body), **extra})
            for name, extra in NOT_1D_SIGNATURES
            for body in [body for body, _ in NOT_1D_CASES] + [NOT_1D_GOOD]
        ],
    }
    flat = [request for group in requests.values() for request in group]
    result, answers = run_feeds_in_serving_process(
        exported, [feed for _, feed in flat], signature=[name for name, _ in flat]
    )
    served, start = {}, 0
    for group, group_requests in requests.items():
        served[group] = (result, answers[start : start + len(group_requests)])
        start += len(group_requests)
    return served


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "keras_attention.export", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _assert_servable(report, layout_rank):
    from keras_attention.export import tf_serving

    assert report.problems == [], report.summary()
    assert set(report.signatures) == SIGNATURES
    for signature in report.signatures.values():
        assert signature["inputs"]["text"] == "string (None,)"
        assert signature["outputs"]["alignment"].startswith("float (")
        assert signature["outputs"]["alignment"].count(",") == layout_rank - 1
    assert report.signatures["beam_search"]["inputs"]["beam_width"] == "int32 ()"
    assert {entry["signature"] for entry in report.warmup} == SIGNATURES
    text_ops = {op for op, source in report.op_sources.items() if source == "tensorflow-text"}
    assert "CaseFoldUTF8" in text_ops and text_ops <= tf_serving.TENSORFLOW_TEXT_OPS
    assert not any(op.startswith("Xla") for op in report.op_counts)
    assert any(tf_serving.TENSORFLOW_TEXT_VERSION in note for note in report.notes)


def test_exported_translator_passes_check_servable(exported_check):
    report, _ = exported_check
    _assert_servable(report, layout_rank=3)
    assert report.signature_inputs == {"text": "string (None,)"}
    assert report.op_sources["MatMul"] == "tensorflow"
    assert set(report.op_sources) == set(report.op_counts)
    warmup = {entry["signature"]: entry for entry in report.warmup}
    assert warmup["serving_default"]["outputs"]["translation"]["shape"] == [2]
    assert not any("keras_attention" in note for note in report.notes)
    assert "OK" in report.summary() and "beam_search inputs" in report.summary()


@pytest.mark.parametrize("beam_width", [1, 4])
def test_transformer_passes_check_servable_at_each_beam_width(
    trained_transformer, exported_transformer, beam_width, tmp_path
):
    from keras_attention.export import check_servable
    from keras_attention.export import export_translator

    path = exported_transformer
    if beam_width == 1:
        path = export_translator(trained_transformer, str(tmp_path / "greedy"))
    _assert_servable(check_servable(path), layout_rank=5)


def test_checker_flags_text_ops_tf_serving_does_not_link(exported, exported_check, monkeypatch):
    import copy

    from keras_attention.export import check
    from keras_attention.export import check_servable

    # The fresh process's answer is replayed: what is tested is how the
    # checker judges it (the process itself ran in `exported_check`).
    _, fresh = exported_check
    monkeypatch.setattr(check, "run_in_serving_process", lambda *a, **k: copy.deepcopy(fresh))
    linked = check.tf_serving.TENSORFLOW_TEXT_OPS - {"CaseFoldUTF8"}
    monkeypatch.setattr(check.tf_serving, "TENSORFLOW_TEXT_OPS", linked)
    report = check_servable(exported)
    (problem,) = report.problems
    assert "CaseFoldUTF8" in problem and "ops_lib" in problem


def _served(path, requests):
    """`requests`: `(signature, texts, extra inputs)`; the outputs of each,
    answered by one fresh serving process (a process costs ~8 s to start)."""
    from keras_attention.export.check import run_feeds_in_serving_process

    feeds = [{"text": np.array(texts, dtype=object), **inputs} for _, texts, inputs in requests]
    result, answers = run_feeds_in_serving_process(
        path, feeds, signature=[signature for signature, _, _ in requests]
    )
    assert result["keras_attention_importable"] is False
    for answer in answers:
        assert result["loaded"] and isinstance(answer, dict), answer
    return answers


def _assert_same(outputs, expected, layout):
    """`layout` maps a `Translation.alignment` to the served row layout."""
    assert [t.decode() for t in outputs["translation"]] == [e.text for e in expected]
    for row, translation in enumerate(expected):
        rows, columns = len(translation.tokens), len(translation.source_tokens)
        assert outputs["output_length"][row] == rows
        assert outputs["source_length"][row] == columns
        np.testing.assert_allclose(
            outputs["alignment"][row, :rows, ..., :columns],
            layout(translation.alignment),
            atol=1e-5,
        )
        assert not outputs["alignment"][row, rows:].any()
        assert [
            t.decode() for t in outputs["source_tokens"][row, :columns]
        ] == translation.source_tokens
        assert [t.decode() for t in outputs["target_tokens"][row, :rows]] == translation.tokens
        assert outputs["score"][row] == pytest.approx(translation.score, abs=1e-4)


def test_fresh_process_without_keras_attention_gives_the_same_outputs(
    trained_translator, served_translator
):

    def same(alignment):
        return alignment

    result, (default, beam) = served_translator["same_outputs"]
    assert result["keras_attention_importable"] is False
    for answer in (default, beam):
        assert result["loaded"] and isinstance(answer, dict), answer
    _assert_same(default, trained_translator.translate(TEXTS), same)
    _assert_same(beam, trained_translator.translate(TEXTS, beam_width=3), same)


def test_served_transformer_matches_translate_per_mode(trained_transformer, exported_transformer):
    # Translation.alignment (layers, heads, T_out, T_in); served rows
    # (T_out, layers, heads, T_in).
    def layout(alignment):
        return np.transpose(alignment, (2, 0, 1, 3))

    default, greedy = _served(
        exported_transformer, [("serving_default", TEXTS, {}), ("greedy", TEXTS, {})]
    )
    _assert_same(default, trained_transformer.translate(TEXTS, beam_width=4), layout)
    _assert_same(greedy, trained_transformer.translate(TEXTS), layout)


def test_signatures_refuse_bad_requests(exported, served_translator):
    import tensorflow_text  # noqa: F401  (a Python consumer must import it)

    loaded = tf.saved_model.load(exported)
    with pytest.raises(tf.errors.InvalidArgumentError, match="string"):
        loaded.signatures["greedy"](text=tf.constant([1, 2]))
    for name, extra in [
        ("serving_default", {}),
        ("greedy", {}),
        ("beam_search", {"beam_width": tf.constant(2)}),
    ]:
        outputs = loaded.signatures[name](text=tf.constant([], tf.string), **extra)
        assert {k: (v.shape[0], v.dtype) for k, v in outputs.items()} == {
            "translation": (0, tf.string),
            "alignment": (0, tf.float32),
            "source_tokens": (0, tf.string),
            "target_tokens": (0, tf.string),
            "score": (0, tf.float32),
            "source_length": (0, tf.int32),
            "output_length": (0, tf.int32),
        }
    for width in (0, 5):
        with pytest.raises(tf.errors.InvalidArgumentError, match="at most 4|least 1"):
            loaded.signatures["beam_search"](
                text=tf.constant(["one"]), beam_width=tf.constant(width)
            )
    # TF Serving's path: the v1 session loader in a process without us.
    result, (too_wide, not_text) = served_translator["bad_requests"]
    assert result["loaded"] and result["keras_attention_importable"] is False
    assert "must be at most 4" in too_wide
    assert "'text' expects string but int32 is provided" in not_text


def _rest_feed(body):
    """The `text` tensor TF Serving's REST API builds from a JSON body.

    Row format (`{"instances": [...]}`): each instance is one example and
    the tensor stacks them, so a list of lists is rank 2. Columnar format
    (`{"inputs": {"text": ...}}` or `{"inputs": ...}`): the value is the
    tensor as written.
    """
    import json

    body = json.loads(body)
    if "instances" in body:
        value = body["instances"]
    else:
        value = body["inputs"]
        value = value["text"] if isinstance(value, dict) else value
    return {"text": np.array(value, dtype=object)}


TEXT_RANK = (
    r"`text` must be a 1-D batch of strings, shape \(B,\)\. Received: "
    r"text with shape\] \[\({shape}\)\]"
)


# A 2-D batch was once answered from its first string ("noir" dropped).
# TF Serving's REST API turns these bodies into rank-2 and rank-0 tensors.
NOT_1D_CASES = [
    ('{"instances": [["three one", "four"]]}', "1,2"),
    ('{"inputs": {"text": [["three"], ["one"]]}}', "2,1"),
    ('{"inputs": "three one"}', ""),
]
# A 1-D batch in row format is served as translate() answers it.
NOT_1D_TEXTS = ["three one", "four", ""]
NOT_1D_GOOD = '{"instances": ["three one", "four", ""]}'
NOT_1D_SIGNATURES = [("serving_default", {}), ("beam_search", {"beam_width": np.int32(2)})]


def test_served_signatures_refuse_a_text_batch_that_is_not_1d(
    trained_translator, exported, served_translator
):
    import tensorflow_text  # noqa: F401  (a Python consumer must import it)

    cases, texts, signatures = NOT_1D_CASES, NOT_1D_TEXTS, NOT_1D_SIGNATURES
    # TF Serving's loader, in a process without keras_attention: the graph's
    # own check is all that stands between the request and the model (the
    # feed bypasses session.run's Python shape check). The shared process
    # answered every request of both signatures, in `NOT_1D_SIGNATURES` order.
    result, answers = served_translator["not_1d"]
    assert len(answers) == len(signatures) * (len(cases) + 1)
    assert result["keras_attention_importable"] is False and result["loaded"]
    for index, (name, extra) in enumerate(signatures):
        served = answers[index * (len(cases) + 1) : (index + 1) * (len(cases) + 1)]
        # One answer per refused case, then the good feed's.
        for (body, shape), answer in zip(cases, served[:-1], strict=True):
            assert isinstance(answer, str), (name, body)
            assert re.search(TEXT_RANK.format(shape=shape), answer), answer
        expected = trained_translator.translate(texts, beam_width=1 if not extra else 2)
        assert [t.decode() for t in served[-1]["translation"]] == [t.text for t in expected]
    # A SavedModel loaded in Python (TF 2): the same check.
    loaded = tf.saved_model.load(exported)
    for body, shape in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=TEXT_RANK.format(shape=shape)):
            loaded.signatures["greedy"](text=tf.constant(_rest_feed(body)["text"].tolist()))


def test_export_arguments_are_checked_before_tracing(trained_translator, tmp_path, monkeypatch):
    from keras_attention.export import export_translator

    traced = []
    monkeypatch.setattr(trained_translator, "serving_outputs", lambda *args: traced.append(args))
    (tmp_path / "a_file").write_text("not a directory")
    cases = [
        (dict(path=None), TypeError, r"`path` must be a string or os.PathLike.*None"),
        (dict(path=str(tmp_path / "a_file")), ValueError, r"`path` is an existing file.*a_file"),
        (
            dict(max_beam_width=0),
            ValueError,
            r"`max_beam_width` must be a positive integer.*max_beam_width=0",
        ),
        (dict(beam_width=2**40), ValueError, r"`beam_width` must be at most"),
        (
            dict(beam_width=5, max_beam_width=4),
            ValueError,
            r"`beam_width` must be at most `max_beam_width`",
        ),
        (dict(length_penalty="0"), ValueError, r"`length_penalty`"),
        (dict(warmup_texts=["\ud800"]), ValueError, r"`warmup_texts` must be valid Unicode"),
        (dict(warmup_texts=[3]), TypeError, r"`warmup_texts` must be strings"),
        (dict(model_name=7), TypeError, r"`model_name` must be a string"),
    ]
    for kwargs, error, pattern in cases:
        kwargs = {"path": str(tmp_path / "model"), **kwargs}
        with pytest.raises(error, match=rf"^export_translator: {pattern}"):
            export_translator(trained_translator, **kwargs)
    assert traced == [] and not (tmp_path / "model").exists()


def test_check_servable_arguments_name_themselves(exported):
    from keras_attention.export import check_servable

    with pytest.raises(TypeError, match=r"^check_servable: `path` must be.*path=None"):
        check_servable(None)
    with pytest.raises(TypeError, match=r"^check_servable: `load`.*load='no'"):
        check_servable(exported, load="no")
    with pytest.raises(ValueError, match=r"^check_servable: `timeout`.*timeout=0"):
        check_servable(exported, timeout=0)


def _prediction_log_class():
    """`tensorflow.serving.PredictionLog`, declared here from TF Serving's
    .proto field numbers, as an independent decoder for the warmup file."""
    from google.protobuf import descriptor_pb2
    from google.protobuf import descriptor_pool
    from google.protobuf import message_factory
    from tensorflow.core.framework import tensor_pb2

    pool = descriptor_pool.DescriptorPool()
    added = set()

    def add(file_descriptor):
        if file_descriptor.name in added:
            return
        for dependency in file_descriptor.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file_descriptor.CopyToProto(proto)
        pool.Add(proto)
        added.add(file_descriptor.name)

    add(tensor_pb2.DESCRIPTOR)
    F = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="test_prediction_log.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=[tensor_pb2.DESCRIPTOR.name],
    )

    def message(name, fields, nested=()):
        result = file_proto.message_type.add(name=name)
        for nested_message in nested:
            result.nested_type.add().CopyFrom(nested_message)
        for field_name, number, kind, type_name, repeated in fields:
            result.field.add(
                name=field_name,
                number=number,
                type=kind,
                type_name=type_name,
                label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL,
            )
        return result

    entry = descriptor_pb2.DescriptorProto(name="InputsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(
        name="value",
        number=2,
        type=F.TYPE_MESSAGE,
        type_name=".tensorflow.TensorProto",
        label=F.LABEL_OPTIONAL,
    )
    message(
        "ModelSpec",
        [
            ("name", 1, F.TYPE_STRING, None, False),
            ("signature_name", 3, F.TYPE_STRING, None, False),
        ],
    )
    message(
        "PredictRequest",
        [
            ("model_spec", 1, F.TYPE_MESSAGE, ".tensorflow.serving.ModelSpec", False),
            ("inputs", 2, F.TYPE_MESSAGE, ".tensorflow.serving.PredictRequest.InputsEntry", True),
        ],
        nested=[entry],
    )
    message(
        "PredictLog", [("request", 1, F.TYPE_MESSAGE, ".tensorflow.serving.PredictRequest", False)]
    )
    message(
        "PredictionLog",
        [("predict_log", 6, F.TYPE_MESSAGE, ".tensorflow.serving.PredictLog", False)],
    )
    pool.Add(file_proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.PredictionLog")
    )


def test_warmup_file_holds_predict_requests(exported):
    import tensorflow as tf

    from keras_attention.export import serving_process

    path = os.path.join(exported, "assets.extra", "tf_serving_warmup_requests")
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    requests = {}
    for record in records:
        log = _prediction_log_class()()
        log.ParseFromString(record)
        request = log.predict_log.request
        assert request.model_spec.name == "translator"
        assert tf.make_ndarray(request.inputs["text"]).tolist() == [b"one two", b""]
        requests[request.model_spec.signature_name] = request
        # The fresh-process decoder reads the same thing.
        signature, inputs = serving_process.parse_predict_log(record)
        assert signature == request.model_spec.signature_name
        assert set(inputs) == set(request.inputs)
    assert set(requests) == SIGNATURES
    assert tf.make_ndarray(requests["beam_search"].inputs["beam_width"]) == 4


def _save_module(path, function):
    import tensorflow as tf

    module = tf.Module()
    module.serve = function
    tf.saved_model.save(module, path, signatures={"serving_default": function})


def test_py_function_and_xla_are_flagged(tmp_path):
    # `tf` is a module global: autograph failed to resolve it as a closure
    # variable in one xdist run.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def with_py_function(x):
        return {"y": tf.py_function(lambda v: v * 2.0, [x], tf.float32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")], jit_compile=True)
    def with_xla(x):
        return {"y": x * 2.0}

    py_path, xla_path = str(tmp_path / "py"), str(tmp_path / "xla")
    _save_module(py_path, with_py_function)
    _save_module(xla_path, with_xla)

    result = _cli("check", py_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and "EagerPyFunc" in result.stdout
    assert "tf_serving_warmup_requests" in result.stdout  # noted as missing

    from keras_attention.export import check_servable

    report = check_servable(xla_path, load=False)
    assert not report.ok and report.op_sources == {}
    assert any("must-compile" in problem for problem in report.problems)


def test_not_a_saved_model_errors_clearly(tmp_path):
    from keras_attention.export import NotASavedModelError
    from keras_attention.export import check_servable

    with pytest.raises(NotASavedModelError, match="does not exist"):
        check_servable(str(tmp_path / "missing"))
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(NotASavedModelError, match="a file"):
        check_servable(str(tmp_path / "file.txt"))
    with pytest.raises(NotASavedModelError, match="no saved_model.pb"):
        check_servable(str(tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "saved_model.pb").write_bytes(b"\xff\xfe not a proto")
    with pytest.raises(NotASavedModelError, match="saved_model.pb that does not parse"):
        check_servable(str(tmp_path / "broken"))
    (tmp_path / "broken_text").mkdir()
    (tmp_path / "broken_text" / "saved_model.pbtxt").write_text("garbage {{")
    with pytest.raises(NotASavedModelError, match="saved_model.pbtxt that does not parse"):
        check_servable(str(tmp_path / "broken_text"))
    result = _cli("check", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert "is not a SavedModel directory" in result.stderr


def _attention_layers():
    """Every public keras_attention layer, as (name, factory, how it is called).

    "cross": layer(query, value, value_mask=...); "self": layer(value,
    mask=...); "plain": layer(value); "image": layer(image) on a channels-last
    map.
    """
    heads = dict(num_heads=2, key_dim=3)
    return [
        ("additive", lambda: ka.AdditiveAttention(units=4), "cross"),
        ("luong_dot", lambda: ka.LuongAttention(score="dot", divide_by_sqrt_dim=True), "cross"),
        ("luong_general", lambda: ka.LuongAttention(score="general"), "cross"),
        ("luong_concat", lambda: ka.LuongAttention(score="concat", units=3), "cross"),
        ("low_rank", lambda: ka.LowRankAttention(rank=2), "cross"),
        ("pooling", lambda: ka.AttentionPooling(score="general"), "self"),
        ("multi_head", lambda: ka.MultiHeadAttention(**heads), "cross"),
        (
            "multi_head_gqa",
            lambda: ka.MultiHeadAttention(
                num_heads=4, key_dim=3, num_key_value_heads=2, use_gate=True
            ),
            "self",
        ),
        (
            "sparse",
            lambda: ka.SparseAttention(
                **heads, block_size=2, window_blocks=3, global_blocks=1, random_blocks=1, seed=1
            ),
            "self",
        ),
        ("performer", lambda: ka.PerformerAttention(**heads, num_features=8, seed=1), "cross"),
        (
            "linformer",
            lambda: ka.LinformerAttention(**heads, projected_length=4, max_length=7),
            "self",
        ),
        (
            "multi_head_t5_bias",
            lambda: ka.MultiHeadAttention(**heads, score_mod=ka.RelativePositionBias(2)),
            "self",
        ),
        ("encoder_block", lambda: ka.TransformerEncoderBlock(2, 3, 8), "self"),
        ("decoder_block", lambda: ka.TransformerDecoderBlock(2, 3, 8), "cross"),
        ("sinusoidal", lambda: ka.SinusoidalPositionEncoding(), "plain"),
        # 4 of the 6 features turn (an odd count is refused, #49).
        ("rotary", lambda: ka.RotaryEmbedding(max_wavelength=100.0, rotary_fraction=0.7), "plain"),
        ("position_embedding", lambda: ka.PositionEmbedding(sequence_length=7), "plain"),
        ("squeeze_excitation", lambda: ka.SqueezeExcitation(ratio=4), "image"),
        ("cbam", lambda: ka.CBAM(ratio=4, kernel_size=3), "image"),
    ]


def test_every_public_layer_is_in_the_export_test():
    public = {
        name
        for name, obj in vars(ka).items()
        if inspect.isclass(obj)
        and issubclass(obj, keras.layers.Layer)
        # The family bases: a user subclasses them, never serves one as is.
        and obj not in (ka.BaseAttention, ka.ScoreAttention, ka.BaseMultiHeadAttention)
    }
    layers = [make() for _, make, _ in _attention_layers()]
    # A layer that is a part of another (a `score_mod`) counts inside it.
    exported = {type(layer).__name__ for layer in layers} | {
        type(layer.score_mod).__name__
        for layer in layers
        if isinstance(getattr(layer, "score_mod", None), keras.layers.Layer)
    }
    assert public <= exported, sorted(public - exported)


def test_models_with_our_layers_export_and_reload_without_keras_attention(tmp_path):
    from keras_attention.export.check import read_saved_model
    from keras_attention.export.check import run_in_serving_process

    keras.utils.set_random_seed(3)
    query = keras.Input((5, 6), name="query")
    value = keras.Input((7, 6), name="value")
    value_mask = keras.Input((7,), dtype="bool", name="value_mask")
    image = keras.Input((3, 4, 8), name="image")
    outputs = {}
    for name, make_layer, mode in _attention_layers():
        layer = make_layer()
        if mode == "cross":
            if isinstance(layer, ka.TransformerDecoderBlock):
                outputs[name] = layer(query, value, encoder_padding_mask=value_mask)
            else:
                outputs[name] = layer(query, value, value_mask=value_mask)
        elif mode == "self":
            if isinstance(layer, ka.TransformerEncoderBlock):
                outputs[name] = layer(value, padding_mask=value_mask)
            else:
                outputs[name] = layer(value, mask=value_mask)
        elif mode == "plain":
            outputs[name] = layer(value)
        else:
            outputs[name] = layer(image)
    model = keras.Model(
        {"query": query, "value": value, "value_mask": value_mask, "image": image},
        outputs,
    )
    rng = np.random.default_rng(0)
    feed = {
        "query": rng.standard_normal((3, 5, 6)).astype("float32"),
        "value": rng.standard_normal((3, 7, 6)).astype("float32"),
        "value_mask": np.arange(7)[None, :] < np.array([[7], [3], [1]]),
        "image": rng.standard_normal((3, 3, 4, 8)).astype("float32"),
    }
    expected = {k: keras.ops.convert_to_numpy(v) for k, v in model(feed).items()}
    path = str(tmp_path / "layers")
    model.export(path, verbose=False)

    proto = read_saved_model(path)
    signature = proto.meta_graphs[0].signature_def["serving_default"]
    assert set(signature.inputs) == set(feed)
    result, served = run_in_serving_process(path, feed=feed)
    assert result["keras_attention_importable"] is False
    assert result["loaded"], result.get("load_error")
    assert set(served) == set(expected)
    for name in expected:
        np.testing.assert_allclose(served[name], expected[name], atol=1e-5, err_msg=name)
