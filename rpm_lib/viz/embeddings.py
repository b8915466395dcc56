"""What a trained model does with problems beyond its accuracy: where its encoder puts them, and what it answers and
predicts for one problem.

The premise of MLCL is that problems sharing rules lie close together in the encoder's embedding space. Here a
problem is represented by the embedding of its *correct* completion (the context panels with the right answer
filled in; ``model(panels)["embeddings"][i, target_i]``, shape ``(D,)``):

* :func:`correct_completion_embeddings` runs a model over problems of a RAVEN dataset (or a generated folder,
  :func:`folder_embeddings`) and keeps those ``(N, D)`` embeddings with each problem's relation per rule group
  (:func:`rule_relations`), the model's answer and the configuration;
* :func:`project_tsne` maps them to ``(N, 2)`` with a seeded t-SNE (scikit-learn), the same picture for the
  same seed;
* :func:`plot_embedding_projection` draws one panel per rule group (``rules.RULE_GROUPS``), each problem
  coloured by the relation (``rules.RELATIONS``) that governs that group;
* :func:`neighbour_agreement` measures the premise without a projection: how often a problem's nearest
  neighbours in the ``D``-dimensional space follow the same relation, beside what chance gives.

:func:`predict_problem` is one problem seen by the model: its chosen answer, and the rules its rule head predicts
beside the true ones, decoded with the model's own rule encoding.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from rpm_lib import rules
from rpm_lib.data.raw_files import SPLITS
from rpm_lib.viz.rule_predictions import rule_comparison_lines, sigmoid

if TYPE_CHECKING:  # torch is imported where a model runs: `rpm_lib.viz` itself draws figures without it
    import torch

#: One colour per relation (``rules.RELATIONS`` order), the same in every panel.
RELATION_COLORS: dict[str, str] = dict(zip(rules.RELATIONS, ("#4477aa", "#ee6677", "#228833", "#ccbb44")))
#: Problems whose chosen component has no such rule group (a one-component configuration asked for component 1).
ABSENT_COLOR = "#bbbbbb"
#: ``relations`` entry of a problem without the rule group (see :func:`rule_relations`).
ABSENT = -1


@dataclass
class ProblemEmbeddings:
    """The encoder's embedding of the correct completion of N problems, with what each problem is.

    Attributes:
        embeddings: float32 ``(N, D)``: ``model(panels)["embeddings"][i, target_i]``.
        relations: int64 ``(N, 4)``: per rule group (``rules.RULE_GROUPS``: Number/Position, Type, Size, Color) the
            index into ``rules.RELATIONS`` of the rule on component ``component``, or ``ABSENT`` (-1) where the
            problem has no such component.
        configuration: int64 ``(N,)``: index into ``configurations``.
        target / chosen: int64 ``(N,)``: the correct answer and the model's top-scored one (the samples' order).
        source_ids: the problems' names (``center_single/RAVEN_3_test``).
        configurations: configuration folder names for ``configuration``.
        component: the component whose rules ``relations`` holds (0: Grid / Left / Up / Out; 1: Right / Down / In).
    """

    embeddings: np.ndarray
    relations: np.ndarray
    configuration: np.ndarray
    target: np.ndarray
    chosen: np.ndarray
    source_ids: list[str]
    configurations: list[str]
    component: int = 0

    def __len__(self) -> int:
        return len(self.embeddings)

    @property
    def accuracy(self) -> float:
        """Fraction of these problems the model answers correctly."""
        return float((self.chosen == self.target).mean()) if len(self) else float("nan")

    @property
    def configuration_names(self) -> list[str]:
        """The short configuration name of every problem (``Center``, ``2x2Grid``, ...), length N."""
        return [rules.SHORT_NAMES.get(self.configurations[c], self.configurations[c]) for c in self.configuration]

    @staticmethod
    def concatenate(parts: Sequence[ProblemEmbeddings]) -> ProblemEmbeddings:
        """One set of several (e.g. one per split of a folder); they must share configurations and component."""
        if not parts:
            raise ValueError("concatenate needs at least one ProblemEmbeddings")
        first = parts[0]
        if any(p.configurations != first.configurations or p.component != first.component for p in parts):
            raise ValueError("concatenate: the parts differ in configurations or component")
        return ProblemEmbeddings(*(np.concatenate([getattr(p, k) for p in parts])
                                   for k in ("embeddings", "relations", "configuration", "target", "chosen")),
                                 [s for p in parts for s in p.source_ids], list(first.configurations), first.component)


def rule_relations(meta_matrices: np.ndarray, component: int = 0) -> np.ndarray:
    """Each problem's relation per rule group on one component, from its ``meta_matrix``.

    Args:
        meta_matrices: ``(N, 8, 9)`` or ``(N, 12, 9)`` RAVEN ``meta_matrix`` (rows 8..11: an I-RAVEN-Mesh Mesh).
        component: 0 or 1 (the shape components), or ``rules.MESH_COMPONENT`` (2).

    Returns:
        int64 ``(N, 4)``: ``[i, g]`` indexes ``rules.RELATIONS`` for rule group ``rules.RULE_GROUPS[g]``, or
        ``ABSENT`` (-1) when problem ``i`` has no such component. The joint "Constant on Number/Position" rule and
        Progression / Arithmetic / Distribute_Three on Number or on Position all belong to group 0.

    Raises:
        ValueError: a malformed ``meta_matrix`` (``rules.raven_rules_from_meta_matrix`` names the row).
    """
    matrices = np.asarray(meta_matrices)
    if matrices.ndim != 3:
        raise ValueError(f"rule_relations: meta_matrices must be (N, rows, 9), got {matrices.shape}")
    out = np.full((len(matrices), len(rules.RULE_GROUPS)), ABSENT, dtype=np.int64)
    # group 0 governs Number and Position, each of the others its own attribute
    group_of = {rules.NUMBER_POSITION: 0, "Number": 0, "Position": 0,
                **{name: g for g, name in enumerate(rules.RULE_GROUPS) if g}}
    for i, matrix in enumerate(matrices):
        for c, relation, attribute in rules.raven_rules_from_meta_matrix(matrix):
            if c == component:
                out[i, group_of[attribute]] = rules.RELATIONS.index(relation)
    return out


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def correct_completion_embeddings(model: torch.nn.Module, dataset: Any, indices: Sequence[int] | None = None,
                                  component: int = 0, batch_size: int = 64,
                                  progress: bool = False) -> ProblemEmbeddings:
    """The model's embedding of the correct completion of problems of a RAVEN dataset.

    Args:
        model: returns ``{"scores": (B, 8), "embeddings": (B, 8, D), ...}`` for panels ``(B, 16, S, S)``
            (an ``RpmModule``, e.g. from ``rpm_lib.pretrained.load_pretrained``); it is put in eval mode.
        dataset: a ``RavenDataset`` read at the model's image size, one view per sample (``make_dataset``).
        indices: the dataset positions to embed, in this order (default: all).
        component: whose rules label the problems (see :func:`rule_relations`).

    Returns:
        :class:`ProblemEmbeddings` of ``len(indices)`` problems.
    """
    import torch
    from tqdm.auto import tqdm

    if getattr(dataset, "kind", None) != "raven":
        raise ValueError("correct_completion_embeddings needs a RAVEN dataset (its meta_matrix names the rules)")
    positions = np.arange(len(dataset)) if indices is None else np.asarray(indices, dtype=np.int64).reshape(-1)
    model.eval()
    device = _model_device(model)
    embeddings, target, chosen = [], [], []
    with torch.no_grad():
        # disable=None: a bar on a terminal only (not redrawn into a log file)
        for start in tqdm(range(0, len(positions), batch_size), desc="embed", unit="batch",
                          disable=None if progress else True, leave=False):
            samples = [dataset[int(k)] for k in positions[start:start + batch_size]]
            panels = torch.stack([s["panels"] for s in samples]).to(device)
            if panels.ndim != 4:
                raise ValueError("correct_completion_embeddings: panels must be (B, 16, S, S), got "
                                 f"{tuple(panels.shape)} (read the dataset with one view)")
            answers = torch.stack([s["target"] for s in samples])
            out = model(panels)
            rows = torch.arange(len(samples))
            embeddings.append(out["embeddings"].float().cpu()[rows, answers].numpy())
            chosen.append(out["scores"].float().cpu().argmax(1).numpy())
            target.append(answers.numpy())
    if not embeddings:
        raise ValueError("correct_completion_embeddings: no problems to embed")
    labels = dataset.labels
    return ProblemEmbeddings(
        embeddings=np.concatenate(embeddings).astype(np.float32),
        relations=rule_relations(labels.meta[positions], component),
        configuration=np.asarray(labels.configurations, dtype=np.int64)[positions],
        target=np.concatenate(target).astype(np.int64), chosen=np.concatenate(chosen).astype(np.int64),
        source_ids=[labels.source_ids[int(k)] for k in positions], configurations=list(labels.group_names),
        component=component)


def select_problems(configurations: np.ndarray, limit: int | None, configuration: int | None = None) -> np.ndarray:
    """Positions of at most ``limit`` problems, spread evenly over the dataset order (which is by configuration,
    so every configuration keeps its share), optionally of one configuration only.

    Args:
        configurations: int64 ``(N,)`` configuration index of each problem (``dataset.configuration_indices``).
        limit: at most this many (None: all).
        configuration: keep only problems of this configuration index (None: all).

    Returns:
        int64 ``(M,)`` increasing positions, ``M <= limit``.
    """
    groups = np.asarray(configurations)
    chosen = np.arange(len(groups)) if configuration is None else np.flatnonzero(groups == configuration)
    if limit is not None and len(chosen) > limit:
        chosen = chosen[np.linspace(0, len(chosen) - 1, num=max(limit, 0)).round().astype(np.int64)]
    return chosen.astype(np.int64)


def folder_embeddings(model: Any, root: str | Path, splits: Sequence[str] = SPLITS, configuration: str = "all",
                      max_problems: int | None = None, component: int = 0, batch_size: int = 64,
                      progress: bool = False) -> ProblemEmbeddings:
    """:func:`correct_completion_embeddings` of the problems of a generated folder (all its ``splits``), read with
    the model's own data settings (``model.config``), as ``rpm_lib.pretrained.evaluate.score_folder`` reads them.

    Args:
        model: an ``RpmModule`` (it carries its ``config``).
        root: a folder or cache of RAVEN problems at the model's image size
            (e.g. ``rpm_lib.pretrained.evaluate.fresh_problems``).
        configuration: ``"all"``, or one configuration's short or folder name.
        max_problems: at most this many problems over all splits, each split contributing in proportion to its
            size and every configuration its share (None: all).
    """
    from rpm_lib.training.samples import make_dataset

    datasets = [make_dataset(model.config, split, root=root) for split in splits]
    wanted = None if configuration.lower() in ("all", "") else rules.resolve_configuration(configuration)
    total = sum(len(d) for d in datasets)
    parts = []
    for dataset in datasets:
        names = list(dataset.labels.group_names)
        if wanted is not None and wanted not in names:
            raise ValueError(f"folder_embeddings: {root} holds no {configuration!r} problems")
        index = None if wanted is None else names.index(wanted)
        share = None if max_problems is None else int(round(max_problems * len(dataset) / max(total, 1)))
        chosen = select_problems(dataset.configuration_indices, share, index)
        if len(chosen):
            parts.append(correct_completion_embeddings(model, dataset, chosen, component, batch_size, progress))
    if not parts:
        raise ValueError(f"folder_embeddings: no problems chosen in {root} (configuration {configuration!r}, "
                         f"max_problems {max_problems})")
    return ProblemEmbeddings.concatenate(parts)


def project_tsne(embeddings: np.ndarray, seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """A 2-D t-SNE of ``(N, D)`` embeddings: float32 ``(N, 2)``; the same ``seed`` gives the same picture on any
    machine.

    Euclidean distances, initialised from PCA (which keeps the global layout better than a random start, and makes
    the picture depend on ``seed`` only through the randomised SVD of that PCA). Perplexity is capped at
    ``(N - 1) / 3`` (scikit-learn refuses a perplexity of ``N`` or more, and a small set needs a small one). Needs
    scikit-learn.
    """
    points = np.asarray(embeddings, dtype=np.float32)
    if points.ndim != 2 or len(points) < 2:
        raise ValueError(f"project_tsne: embeddings must be (N >= 2, D), got {points.shape}")
    try:
        from sklearn.manifold import TSNE
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise ImportError("the t-SNE projection needs scikit-learn (pip install scikit-learn)") from None
    tsne = TSNE(n_components=2, perplexity=min(perplexity, max((len(points) - 1) / 3, 1.0)), init="pca",
                learning_rate="auto", random_state=seed)
    # One thread: Barnes-Hut t-SNE sums its gradient in another order on more threads, which moves every point (the
    # seed alone would not fix the picture), and on a busy machine extra threads made it several times slower.
    with threadpool_limits(limits=1):
        return tsne.fit_transform(points).astype(np.float32)


class Agreement(NamedTuple):
    """:func:`neighbour_agreement`'s result, float64 ``(G,)`` arrays (one entry per rule group).

    Attributes:
        agreement: the mean fraction of a problem's ``k`` nearest neighbours that follow its relation.
        chance: the same fraction for neighbours drawn at random, ``sum_r n_r (n_r - 1) / (n (n - 1))``.
        k: the neighbours counted per problem.
    """

    agreement: np.ndarray
    chance: np.ndarray
    k: int


def neighbour_agreement(embeddings: np.ndarray, relations: np.ndarray, k: int = 10) -> Agreement:
    """How often a problem's ``k`` nearest neighbours (Euclidean, in the ``D``-dimensional space) share its
    relation, per rule group, beside the rate that random neighbours give.

    Args:
        embeddings: ``(N, D)``.
        relations: int64 ``(N, G)`` relation per rule group (``ABSENT`` problems are left out of that group).
        k: neighbours per problem (capped at the number of other problems).

    Returns:
        :class:`Agreement`; NaN for a group with fewer than two problems.
    """
    points = np.asarray(embeddings, dtype=np.float64)
    labels = np.asarray(relations)
    if labels.ndim != 2 or len(labels) != len(points) or k < 1:
        raise ValueError(f"neighbour_agreement: {points.shape} embeddings, {labels.shape} relations, k={k}")
    agreement = np.full(labels.shape[1], np.nan)
    chance = np.full(labels.shape[1], np.nan)
    for g in range(labels.shape[1]):
        present = np.flatnonzero(labels[:, g] != ABSENT)
        n = len(present)
        if n < 2:
            continue
        group, x = labels[present, g], points[present]
        counts = np.bincount(group)
        chance[g] = float((counts * (counts - 1)).sum() / (n * (n - 1)))
        kk = min(k, n - 1)
        squared = (x * x).sum(1)
        same = 0.0
        for start in range(0, n, 1024):  # blocks of rows: a (n, n) distance matrix of a large set would not fit
            block = x[start:start + 1024]
            distance = squared[start:start + 1024, None] - 2 * block @ x.T + squared[None, :]
            distance[np.arange(len(block)), np.arange(start, start + len(block))] = np.inf  # not its own neighbour
            nearest = np.argpartition(distance, kk - 1, axis=1)[:, :kk]
            same += float((group[nearest] == group[start:start + 1024, None]).sum())
        agreement[g] = same / (n * kk)
    return Agreement(agreement, chance, k)


def plot_embedding_projection(points_2d: np.ndarray, relations: np.ndarray, title: str | None = None,
                              configurations: Sequence[str] | None = None, scores: Agreement | None = None,
                              ncols: int | None = None, panel_inches: float = 4.2) -> Figure:
    """Scatter plots of a 2-D projection, one panel per rule group, each problem coloured by its relation there.

    Args:
        points_2d: ``(N, 2)`` (e.g. :func:`project_tsne`).
        relations: int64 ``(N, 4)``: index into ``rules.RELATIONS`` per rule group of ``rules.RULE_GROUPS``,
            ``ABSENT`` for problems without that component (drawn grey).
        title: figure title.
        configurations: N configuration names: adds a last panel coloured by configuration (problems of one
            configuration look alike, which shapes the projection as much as their rules may).
        scores: :func:`neighbour_agreement` of the same problems: written under each group's name.
        ncols: panels per row (default: 2 for the four rule groups alone, 3 with the configuration panel).

    Returns:
        A figure with one axes per rule group (titled with the group's name), then the configuration panel if
        asked (unused grid cells are removed); each panel's legend below it, with the number of problems per
        relation. Same colours for the same relation in every panel (``RELATION_COLORS``).
    """
    points = np.asarray(points_2d, dtype=float)
    labels = np.asarray(relations)
    if points.ndim != 2 or points.shape[1] != 2 or labels.shape != (len(points), len(rules.RULE_GROUPS)):
        raise ValueError(f"plot_embedding_projection: points {points.shape} must be (N, 2) and relations "
                         f"{labels.shape} (N, {len(rules.RULE_GROUPS)})")
    if configurations is not None and len(configurations) != len(points):
        raise ValueError(f"plot_embedding_projection: {len(configurations)} configurations for {len(points)} points")
    panels = len(rules.RULE_GROUPS) + (configurations is not None)
    ncols = max(1, min(ncols or (2 if panels == 4 else 3), panels))
    nrows = -(-panels // ncols)
    # 1.4 in per row for the two-line title above and the legend below each panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_inches * ncols, (panel_inches + 1.4) * nrows),
                             layout="constrained", squeeze=False)
    axes = axes.ravel()
    for ax in axes[panels:]:
        ax.remove()
    size = max(4.0, min(20.0, 8000.0 / max(len(points), 1)))  # dots that stay apart at 100 and at 7,000 problems
    colours = {**{r: RELATION_COLORS[name] for r, name in enumerate(rules.RELATIONS)}, ABSENT: ABSENT_COLOR}
    names = {**dict(enumerate(rules.RELATIONS)), ABSENT: "no such component"}
    for g, (ax, group) in enumerate(zip(axes, rules.RULE_GROUPS)):
        _scatter(ax, points, labels[:, g], colours, names, size)
        subtitle = ""
        if scores is not None and not np.isnan(scores.agreement[g]):
            subtitle = (f"\nsame rule as its {scores.k} nearest neighbours: {scores.agreement[g]:.0%} "
                        f"(chance {scores.chance[g]:.0%})")
        ax.set_title(f"{group}{subtitle}", fontsize=9)
    if configurations is not None:
        present = list(dict.fromkeys(configurations))
        codes = np.array([present.index(c) for c in configurations])
        palette = plt.get_cmap("tab10")
        _scatter(axes[panels - 1], points, codes, {i: palette(i % 10) for i in range(len(present))},
                 dict(enumerate(present)), size)
        axes[panels - 1].set_title("configuration", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def _scatter(ax, points: np.ndarray, codes: np.ndarray, colours: Mapping[int, Any], names: Mapping[int, str],
             size: float) -> None:
    """One panel: every point coloured by its code, a legend of the codes present (with counts) below the axes."""
    present = sorted(set(codes.tolist()))
    # grey problems without the component first, under the others; listed last
    for code in present:
        chosen = codes == code
        ax.scatter(points[chosen, 0], points[chosen, 1], s=size, color=colours[code], alpha=0.8, linewidths=0)
    handles = [Line2D([], [], marker="o", linestyle="", color=colours[code], markersize=6,
                      label=f"{names[code]} ({int((codes == code).sum())})")
               for code in sorted(present, key=lambda c: (c == ABSENT, c))]
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal", adjustable="datalim")
    # Below the axes: inside it would hide the points it explains.
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize=8, frameon=False,
              handletextpad=0.2, columnspacing=0.8)


# ----------------------------------------------------------------------------------------------
# One problem
# ----------------------------------------------------------------------------------------------


@dataclass
class ProblemPrediction:
    """One problem as the model sees it.

    Attributes:
        index: position in the dataset; source_id: the problem's name; configuration: its folder name.
        target / chosen: the correct answer and the model's top-scored choice (0..7, the sample's order).
        scores: float32 ``(8,)`` the model's answer logits.
        true_rules: the problem's rules in words, decoded from its rule vector with the model's encoding.
        predicted_rules: the rules the rule head predicts (probability above the threshold) in the same words;
            None when the model has no rule head.
    """

    index: int
    source_id: str
    configuration: str
    target: int
    chosen: int
    scores: np.ndarray
    true_rules: list[str]
    predicted_rules: list[str] | None

    @property
    def rule_lines(self) -> list[str] | None:
        """``ok`` / ``missing`` / ``extra`` before each rule (``viz.rule_comparison_lines``); None without a rule
        head."""
        return None if self.predicted_rules is None else rule_comparison_lines(self.true_rules, self.predicted_rules)

    @property
    def summary(self) -> str:
        """``"<source_id> (answer a, chosen c: correct|wrong)"``."""
        verdict = "correct" if self.chosen == self.target else "wrong"
        return f"{self.source_id} (answer {self.target}, chosen {self.chosen}: {verdict})"


def predict_problem(model: Any, dataset: Any, index: int, threshold: float = 0.5) -> ProblemPrediction:
    """The model's answer and rule predictions for problem ``index`` of a RAVEN dataset read with its settings.

    The rules are decoded with the model's encoding (``model.config.rule_spec``), components named as the problem's
    configuration names them; a rule is predicted when its sigmoid probability exceeds ``threshold``.
    """
    import torch

    sample = dataset[int(index)]
    configuration = dataset.labels.group_names[int(sample["configuration"])]
    encoding = model.config.rule_spec
    model.eval()
    with torch.no_grad():
        out = model(sample["panels"][None].to(_model_device(model)))
    scores = out["scores"].float().cpu().numpy()[0]
    truth = encoding.decode(sample[encoding.sample_key].numpy(), configuration=configuration)
    predicted = None
    if "rule_logits" in out:
        predicted = encoding.decode(sigmoid(out["rule_logits"].float().cpu().numpy()[0]), threshold,
                                    configuration=configuration)
    return ProblemPrediction(int(index), str(sample["source_id"]), configuration, int(sample["target"]),
                             int(scores.argmax()), scores.astype(np.float32), truth, predicted)
