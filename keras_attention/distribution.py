"""Layouts for `keras.distribution`: our layers' weights over a device mesh.

`get_layout_map(device_mesh)` returns a `keras.distribution.LayoutMap` for
`keras.distribution.ModelParallel` (JAX backend), in the manner of KerasHub's
backbones (`GemmaBackbone.get_layout_map(device_mesh,
model_parallel_dim_name="model")`): attention heads are sharded on the mesh's
`"model"` axis (Megatron-style: the query/key/value projections split by
head, the output projection by its input heads) and the feed-forward
layers of the Transformer blocks by their hidden units; every other weight
(feature dimensions, layer norms, Performer features, Linformer
projections, Sparse block plans, additive/Luong scores) is replicated.

Keys are full-path regular expressions (Keras matches them with
`re.fullmatch`) anchored on a sublayer name, so one variable path never
matches two keys: loose patterns in KerasHub's style
(`"decoder_block.*attention.*(query|key|value).*kernel"`) match any path
that merely contains the words, and `LayoutMap` rejects a variable that two
keys match.

```python
devices = keras.distribution.list_devices()
mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), devices)
layout_map = keras_attention.distribution.get_layout_map(mesh)
distribution = keras.distribution.ModelParallel(
    layout_map=layout_map, batch_dim_name="batch")
with distribution.scope():
    model = ...  # heads must be divisible by the "model" axis
```

The multi-head layers and the Transformer blocks check, when they build
under a distribution, that every weight they are about to create divides
over the mesh axes its layout names (`check_layout`), so a bad head count
raises a `ValueError` naming the argument, the mesh and the shape instead of
an error deep inside JAX's sharding.
"""

import keras

from keras_attention import validation
from keras_attention.api_export import keras_attention_export

# Sublayer names of the multi-head family (Keras' own MultiHeadAttention
# uses the same names, so the map shards it too).
_HEAD_PROJECTIONS = "(?:query|key|value|gate)"
_ANY_PREFIX = "(?:.*/)?"


def _describe_mesh(mesh):
    return f"DeviceMesh(shape={tuple(mesh.shape)}, axis_names={tuple(mesh.axis_names)})"


def _check_mesh(device_mesh, argument, axis):
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise TypeError(
            "get_layout_map: `device_mesh` must be a "
            "keras.distribution.DeviceMesh. Received: "
            f"device_mesh={device_mesh!r}"
        )
    if axis not in device_mesh.axis_names:
        raise ValueError(
            f"get_layout_map: `{argument}` must name an axis of the mesh "
            f"{_describe_mesh(device_mesh)}. Received: {argument}={axis!r}"
        )


@keras_attention_export("distribution", serializable=False)
def get_layout_map(device_mesh, model_axis="model"):
    """A `keras.distribution.LayoutMap` sharding our layers' heads.

    The rules, for `keras.distribution.ModelParallel(layout_map=...)`:

    - `.../{query,key,value,gate}/kernel` `(features, H, D)`:
      `(None, model, None)`; their biases `(H, D)`: `(model, None)`;
    - `.../attention_output/kernel` `(H, Dv, features)`:
      `(model, None, None)`; its bias is replicated;
    - `.../feedforward_intermediate_dense/kernel` `(d, ff)`:
      `(None, model)`, its bias `(model,)`;
      `.../feedforward_output_dense/kernel` `(ff, d)`: `(model, None)`;
    - everything else replicated (no key matches it).

    `H` (and `num_key_value_heads`, and `intermediate_dim`) must be
    divisible by the size of `model_axis`.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh`, for example of shape
            `(data, model)` with axis names `("batch", "model")`.
        model_axis: the mesh axis the heads (and the Transformer blocks'
            feed-forward hidden units) are split over.

    Returns:
        The `LayoutMap`.
    """
    _check_mesh(device_mesh, "model_axis", model_axis)
    m = model_axis
    layout_map = keras.distribution.LayoutMap(device_mesh)
    layout_map[f"{_ANY_PREFIX}{_HEAD_PROJECTIONS}/kernel"] = (None, m, None)
    layout_map[f"{_ANY_PREFIX}{_HEAD_PROJECTIONS}/bias"] = (m, None)
    layout_map[f"{_ANY_PREFIX}attention_output/kernel"] = (m, None, None)
    layout_map[f"{_ANY_PREFIX}feedforward_intermediate_dense/kernel"] = (None, m)
    layout_map[f"{_ANY_PREFIX}feedforward_intermediate_dense/bias"] = (m,)
    layout_map[f"{_ANY_PREFIX}feedforward_output_dense/kernel"] = (m, None)
    return layout_map


def check_layout(layer, weights):
    """Raises before a weight is created that its layout cannot shard.

    Args:
        layer: the layer being built (its `path` is the weights' prefix).
        weights: `{relative path: (shape, names)}`, where `names[i]` says
            which constructor argument or input sets dimension `i`
            (e.g. `"num_heads"`), for the error message.

    Does nothing outside a distribution, or when the distribution has no
    layout for the paths (`DataParallel` replicates every weight).
    """
    distribution = keras.distribution.distribution()
    if distribution is None:
        return
    mesh = distribution.device_mesh
    sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))
    for relative, (shape, names) in weights.items():
        path = f"{layer.path}/{relative}" if layer.path else relative
        layout = distribution.get_tensor_layout(path)
        if layout is None:
            continue
        axes = tuple(getattr(layout, "axes", layout))
        if len(axes) > len(shape):
            raise ValueError(
                f"{validation.owner_name(layer)}: the layout "
                f"of weight '{path}' (shape {tuple(shape)}) is {axes}, which "
                f"has more axes than the weight; mesh {_describe_mesh(mesh)}"
            )
        for dim, axis in enumerate(axes):
            if axis is None or shape[dim] % sizes[axis] == 0:
                continue
            raise ValueError(
                f"{validation.owner_name(layer)}: "
                f"`{names[dim]}`={shape[dim]} is not divisible by the mesh "
                f"axis '{axis}' of size {sizes[axis]} that the layout "
                f"{axes} of weight '{path}' (shape {tuple(shape)}) shards it "
                f"over; mesh {_describe_mesh(mesh)}"
            )


from keras_attention.api_export import public_names  # noqa: E402

__all__ = public_names("distribution")
