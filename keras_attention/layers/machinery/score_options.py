"""The score modifiers a multi-head layer offers, defined once.

`MultiHeadAttention` and `SparseAttention` take the same keyword-only
arguments: `logit_soft_cap`, `alibi`, `attention_sinks` and `score_mod`.
They are validated (`validate_score_options`), given their weights, saved in
the config and turned into the kernels' `ScoreModifier` here
(`ScoreModifierOptions`), so the two layers cannot drift apart.
"""

import keras
import numpy as np

from keras_attention import validation
from keras_attention.ops import mods
from keras_attention.ops import score_modifier

SCORE_SIGNATURE = "(score, batch, head, q_idx, k_idx) -> score"


def user_function(owner, argument, function, signature):
    """A user function argument (`score_mod`, `mask_mod`), deserialized from
    a `.keras` file's config when it comes as one, its arity checked."""
    if isinstance(function, dict):
        function = keras.saving.deserialize_keras_object(function)
    if isinstance(function, keras.layers.Layer):  # its `call` takes its weights itself
        return mods.check_signature(owner, argument, function, 0, signature)
    num_args = 4 if argument == "mask_mod" else 5
    return mods.check_signature(owner, argument, function, num_args, signature)


def validate_alibi(owner, alibi, num_heads):
    """`alibi`: None/False (off), True (the paper's slopes) or `num_heads`
    slopes; returns None, True or a list of floats."""
    if alibi is None or alibi is False:
        return None
    if alibi is True:
        return True
    if isinstance(alibi, (str, bytes)) or not hasattr(alibi, "__len__"):
        raise TypeError(
            f"{owner}: `alibi` must be None, True (the paper's slopes) or a "
            f"list of {num_heads} slopes. Received: alibi={alibi!r}"
        )
    try:
        shape = np.shape(alibi)
    except ValueError:  # a ragged nesting
        shape = None
    if shape != (num_heads,):
        raise ValueError(
            f"{owner}: `alibi` must give one slope per query head, shape "
            f"({num_heads},). Received: "
            f"{'a ragged alibi' if shape is None else f'alibi with shape {shape}'}: {alibi!r}"
        )
    return [validation.validate_real(owner, "alibi", value) for value in alibi]


def validate_score_options(owner, num_heads, *, logit_soft_cap, alibi, attention_sinks, score_mod):
    """The four arguments checked (errors name `owner`), as a dict of the
    attributes `ScoreModifierOptions` reads."""
    if logit_soft_cap is not None:
        logit_soft_cap = validation.validate_real(
            owner, "logit_soft_cap", logit_soft_cap, low=0.0, include_low=False
        )
    alibi = validate_alibi(owner, alibi, num_heads)
    attention_sinks = validation.validate_bool(owner, "attention_sinks", attention_sinks)
    score_mod = user_function(owner, "score_mod", score_mod, SCORE_SIGNATURE)
    if isinstance(score_mod, keras.layers.Layer) and not (
        hasattr(score_mod, "modify_scores") and hasattr(type(score_mod), "score_weights")
    ):
        raise TypeError(
            f"{owner}: a layer given as `score_mod` must have `modify_scores(score, "
            "batch, head, q_idx, k_idx, *weights)` and `score_weights` (as "
            f"RelativePositionBias). Received: score_mod={score_mod!r}"
        )
    if getattr(score_mod, "num_heads", num_heads) != num_heads:
        raise ValueError(
            f"{owner}: `score_mod` has {score_mod.num_heads} heads, the layer "
            f"{num_heads}. Received: score_mod={score_mod!r}, num_heads={num_heads!r}"
        )
    return {
        "logit_soft_cap": logit_soft_cap,
        "alibi": alibi,
        "attention_sinks": attention_sinks,
        "score_mod": score_mod,
    }


class ScoreModifierOptions:
    """Mixin of a `BaseMultiHeadAttention` that offers the score modifiers.

    The layer calls `_set_score_options` with `validate_score_options`'s
    result after the base's `__init__`, `_build_score_options` in `build`
    (the `sinks` weight, after the projections), passes `_score_modifier()`
    to its kernels and adds `_score_options_config()` to its config.
    """

    def _set_score_options(self, options):
        for name, value in options.items():
            setattr(self, name, value)

    def _build_score_options(self):
        if isinstance(self.score_mod, keras.layers.Layer) and not self.score_mod.built:
            self.score_mod.build()
        if self.attention_sinks:
            # One sink logit per head, in every row's softmax denominator.
            self.sinks = self.add_weight(
                name="sinks", shape=(self._num_heads,), initializer="zeros", trainable=True
            )

    @property
    def _modifies_scores(self):
        """Whether any score modifier is set (the selector's question)."""
        return (
            self.logit_soft_cap is not None
            or self.alibi is not None
            or self.attention_sinks
            or self.score_mod is not None
        )

    def _score_modifier(self):
        """The layer's `ScoreModifier`, or None when no score is changed."""
        if not self._modifies_scores:
            return None
        slopes = None
        if self.alibi is not None:
            slopes = (
                score_modifier.alibi_slopes(self._num_heads) if self.alibi is True else self.alibi
            )
        score_mod, weights = self.score_mod, ()
        if isinstance(score_mod, keras.layers.Layer):
            # A layer with weights (`RelativePositionBias`): its function
            # takes them as arguments, so every kernel differentiates them.
            weights = tuple(score_mod.score_weights)
            score_mod = score_mod.modify_scores
        score_mod = mods.UserMod.wrap(
            score_mod, "score_mod", type(self).__name__, num_weights=len(weights)
        )
        return score_modifier.ScoreModifier(
            soft_cap=self.logit_soft_cap,
            alibi_slopes=slopes,
            sink_logits=self.sinks if self.attention_sinks else None,
            score_mod=score_mod,
            score_mod_weights=weights,
        )

    def _score_options_config(self):
        return {
            "logit_soft_cap": self.logit_soft_cap,
            "alibi": self.alibi,
            "attention_sinks": self.attention_sinks,
            "score_mod": (
                None
                if self.score_mod is None
                else keras.saving.serialize_keras_object(self.score_mod)
            ),
        }
