"""Train a tiny classifier with attention pooling and show where it looks.

The task is generated here: a sequence of random tokens is labelled 1 when it
contains the keyword token, 0 otherwise. A model that solves it by attention
should put its weight on the keyword. Run: `python examples/quickstart.py`.
"""

import argparse
import os

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")

import keras_attention  # noqa: E402  (first: a quiet TensorFlow start)

# isort: split
import keras  # noqa: E402
import numpy as np  # noqa: E402

KEYWORD = 7
VOCAB = 40


def make_data(n, max_length, rng):
    tokens = rng.integers(KEYWORD + 1, VOCAB, size=(n, max_length)).astype("int32")
    labels = rng.integers(0, 2, size=n).astype("int32")
    for row, label in zip(tokens, labels, strict=True):
        length = rng.integers(max_length // 2, max_length + 1)
        row[length:] = 0  # padding, masked by the Embedding
        if label:
            row[rng.integers(0, length)] = KEYWORD
    return tokens, labels


def build_model(score):
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 24, mask_zero=True),
            keras.layers.Bidirectional(keras.layers.GRU(16, return_sequences=True)),
            keras_attention.AttentionPooling(score=score, name="pooling"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )


def attention_bar(tokens, weights):
    lines = []
    for token, weight in zip(tokens, weights, strict=True):
        if token == 0:
            break
        mark = "  <- keyword" if token == KEYWORD else ""
        lines.append(f"  token {token:3d} {'#' * int(round(weight * 40)):<40} {weight:.2f}{mark}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--score",
        default="additive",
        choices=["additive", "dot", "scaled_dot", "general", "concat"],
    )
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--length", type=int, default=12)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    x_train, y_train = make_data(args.samples, args.length, rng)
    x_test, y_test = make_data(500, args.length, rng)

    model = build_model(args.score)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=True,
    )
    model.fit(x_train, y_train, epochs=args.epochs, batch_size=64, verbose=2)
    accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
    print(f"\nHeld-out accuracy with {args.score} attention pooling: {accuracy:.3f}")

    # Where does the pooling look? Read its weights for a few positive examples.
    with keras_attention.layers.capture_attention(model) as captured:
        model(x_test[:64])
    weights = captured["pooling_attention"][0][:, 0, :]  # (batch, 1, T) -> (batch, T)
    positives = np.flatnonzero(y_test[:64] == 1)
    on_keyword = [weights[i][x_test[i] == KEYWORD].sum() for i in positives]
    print(
        f"Mean attention weight on the keyword: {np.mean(on_keyword):.2f} "
        f"(uniform would be about {1 / (0.75 * args.length):.2f})\n"
    )
    print("Attention over one positive example:")
    print(attention_bar(x_test[positives[0]], weights[positives[0]]))
    return accuracy


if __name__ == "__main__":
    main()
