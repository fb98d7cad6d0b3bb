"""The shared validators: owner names, NumPy scalars, strict bools, axes."""

import keras
import numpy as np
import pytest

from keras_attention import validation


def test_owner_name_for_strings_layers_and_other_objects():
    assert validation.owner_name("Translator.translate") == "Translator.translate"
    layer = keras.layers.Dense(2, name="proj")
    assert validation.owner_name(layer) == "Dense (layer 'proj')"
    assert validation.owner_name(object()) == "object"
    assert validation.error(layer, "bad").startswith("Dense (layer 'proj'): bad")


@pytest.mark.parametrize("value", [2, np.int64(2), np.int32(2), np.array(2)])
def test_numpy_integers_count_as_the_ints_they_hold(value):
    result = validation.validate_positive_int("Owner", "units", value)
    assert result == 2 and type(result) is int


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "2", None, np.float32(2)])
def test_non_positive_or_non_integers_are_refused_by_name(value):
    with pytest.raises(
        ValueError, match=r"Owner: `units` must be a positive integer.*Received: units="
    ):
        validation.validate_positive_int("Owner", "units", value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_bools_pass_as_python_bools(value):
    assert validation.validate_bool("Owner", "use_gate", value) is bool(value)


@pytest.mark.parametrize("value", ["no", "yes", 1, 0, None, np.int64(1)])
def test_truthy_stand_ins_are_not_bools(value):
    with pytest.raises(TypeError, match=r"`use_gate` must be True or False.*Received: use_gate="):
        validation.validate_bool("Owner", "use_gate", value)


def test_rates_reals_and_choices():
    assert validation.validate_rate("Owner", "dropout", np.float32(0.5)) == 0.5
    with pytest.raises(ValueError, match="dropout=1.5"):
        validation.validate_rate("Owner", "dropout", 1.5)
    assert validation.validate_real("Owner", "length_penalty", np.float32(0.5), low=0) == 0.5
    with pytest.raises(ValueError, match=r"in \(0"):
        validation.validate_real("Owner", "t", 0.0, low=0, include_low=False)
    with pytest.raises(ValueError, match="finite"):
        validation.validate_real("Owner", "t", float("nan"))
    assert validation.validate_choice("Owner", "mode", "dot", ("dot", "concat")) == "dot"
    with pytest.raises(ValueError, match=r"one of \('dot', 'concat'\)"):
        validation.validate_choice("Owner", "mode", "Dot", ("dot", "concat"))
    with pytest.raises(ValueError):  # type-strict: True == 1
        validation.validate_choice("Owner", "flag", 1, (True, False))


def test_axes_duplicates_and_aliases_are_refused():
    assert validation.validate_axes("Owner", "attention_axes", np.int64(1)) == (1,)
    assert validation.validate_axes("Owner", "attention_axes", [1, 2]) == (1, 2)
    with pytest.raises(ValueError, match=r"must not repeat an axis.*attention_axes=\(1, 1\)"):
        validation.validate_axes("Owner", "attention_axes", (1, 1))
    assert validation.resolve_axes("Owner", "attention_axes", (-2,), rank=4) == (2,)
    with pytest.raises(ValueError, match=r"one axis twice.*\(1, 1\).*attention_axes=\(1, -2\)"):
        validation.resolve_axes("Owner", "attention_axes", (1, -2), rank=3)
    with pytest.raises(ValueError, match="rank 3"):
        validation.resolve_axes("Owner", "attention_axes", (2,), rank=3)


def test_masks_as_lists_are_refused_by_name():
    with pytest.raises(TypeError, match=r"`attention_mask` must be a boolean tensor.*np.asarray"):
        validation.check_mask(
            "Owner", "attention_mask", [[True]], (None, None, None), broadcast=True
        )
