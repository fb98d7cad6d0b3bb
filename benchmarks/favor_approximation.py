"""How well FAVOR+ approximates exact softmax attention, vs `num_features`.

The setting of the Performer paper's Fig. 4 (Choromanski et al. 2021): one
fixed draw of queries, keys and values with i.i.d. N(0, 1) entries, L = 4096,
d = 16, and the random features redrawn `--draws` times for each
`num_features` m. For each m we report the mean squared error, against exact
softmax attention, of

- the row-normalised attention matrix `D^-1 A` (L x L), and
- the attention output `D^-1 A V` (L x d),

for the four combinations {orthogonal, independent} x {positive (FAVOR+),
trigonometric (sin/cos)} features, with the standard deviation over draws as
error bars. Both estimators use `m` random projections (trigonometric
features then have `2 m` entries: a cos and a sin per projection).

The features come from `keras_attention.ops.favor` (the code the layer
uses); the L x L products are done in NumPy.

Usage:
    KERAS_BACKEND=tensorflow flock /tmp/heavy.lock \
        python benchmarks/favor_approximation.py [--length 4096] [--draws 20]
"""

import argparse
import os
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")

import keras_attention  # noqa: E402,F401  (first: a quiet TensorFlow start)

# isort: split
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention.ops import favor  # noqa: E402

VARIANTS = (
    ("positive", True),
    ("positive", False),
    ("trigonometric", True),
    ("trigonometric", False),
)


def exact_attention(query, key):
    scores = query @ key.T / np.sqrt(query.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def approximate_attention(query, key, projection, features):
    def phi(x, is_query):
        x = keras.ops.convert_to_tensor(x[None, None])  # (1, 1, L, d)
        if features == "positive":
            out = favor.softmax_features(x, projection, is_query=is_query)
        else:
            out = favor.trigonometric_features(x, projection)
        return keras.ops.convert_to_numpy(out)[0, 0].astype(np.float64)

    kernel = phi(query, True) @ phi(key, False).T
    return kernel / kernel.sum(-1, keepdims=True)


def run(length, dim, draws, feature_counts, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    query = (scale * rng.standard_normal((length, dim))).astype("float32")
    key = (scale * rng.standard_normal((length, dim))).astype("float32")
    value = rng.standard_normal((length, dim))
    exact = exact_attention(query.astype(np.float64), key.astype(np.float64))
    exact_output = exact @ value
    results = {}
    for features, orthogonal in VARIANTS:
        for m in feature_counts:
            matrix_errors, output_errors = [], []
            for draw in range(draws):
                projection = favor.random_projection(
                    m, dim, orthogonal=orthogonal, seed=(seed, m, draw, orthogonal)
                )
                approx = approximate_attention(query, key, projection, features)
                matrix_errors.append(np.mean((approx - exact) ** 2))
                output_errors.append(np.mean((approx @ value - exact_output) ** 2))
            results[features, orthogonal, m] = (np.array(matrix_errors), np.array(output_errors))
            print(
                f"{features:13s} {'orthogonal' if orthogonal else 'independent':11s} "
                f"m={m:4d}  attention MSE {np.mean(matrix_errors):.3e} "
                f"+- {np.std(matrix_errors):.1e}   output MSE "
                f"{np.mean(output_errors):.3e} +- {np.std(output_errors):.1e}",
                flush=True,
            )
    return results


def markdown_table(results, feature_counts):
    header = (
        "| m | "
        + " | ".join(f"{f} {'orth' if o else 'iid'} (matrix / output)" for f, o in VARIANTS)
        + " |"
    )
    lines = [header, "|" + "---|" * (len(VARIANTS) + 1)]
    for m in feature_counts:
        cells = []
        for f, o in VARIANTS:
            matrix, output = results[f, o, m]
            cells.append(
                f"{matrix.mean():.2e} ± {matrix.std():.0e} / "
                f"{output.mean():.2e} ± {output.std():.0e}"
            )
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results, feature_counts, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (axis, name) in enumerate(
        zip(axes, ("attention matrix MSE", "output MSE"), strict=True)
    ):
        for features, orthogonal in VARIANTS:
            means = [results[features, orthogonal, m][index].mean() for m in feature_counts]
            stds = [results[features, orthogonal, m][index].std() for m in feature_counts]
            axis.errorbar(
                feature_counts,
                means,
                yerr=stds,
                capsize=3,
                marker="o",
                linestyle="-" if features == "positive" else "--",
                label=f"{features}, {'orthogonal' if orthogonal else 'independent'}",
            )
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("num_features m")
        axis.set_ylabel(name)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"saved {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--features", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="standard deviation of the query and key entries",
    )
    parser.add_argument(
        "--plot",
        default=os.path.join(os.path.dirname(__file__), "favor_approximation.png"),
    )
    args = parser.parse_args()
    start = time.time()
    results = run(args.length, args.dim, args.draws, args.features, args.seed, args.scale)
    print()
    print(markdown_table(results, args.features))
    plot(
        results,
        args.features,
        args.plot,
        f"FAVOR+ vs exact softmax, L={args.length}, d={args.dim}, "
        f"q, k ~ N(0, {args.scale:g}^2), "
        f"{args.draws} draws (mean ± std)",
    )
    print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
