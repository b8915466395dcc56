"""Figures, split by what they show; every public name is importable from ``rpm_lib.viz``.

==================== =============================================================================
module               what
==================== =============================================================================
``rpm``              one RPM (``plot_rpm``) or a gallery, from arrays or a dataset; the solved matrix
``dataset``          rule frequencies and answer positions per configuration, dataset summaries
``training_curves``  losses and accuracies over epochs from ``history.csv``
``evaluation``       accuracy bars with references and chance, confusions, Table 1, ablations
``rule_predictions`` true vs predicted rule vectors, per-rule F1, rule sets compared in words
``augmentations``    what each transform of a recipe does to one RPM
``regimes``          generalisation regimes: rule mix per split kind, accuracy in vs out of distribution
``embeddings``       a trained model's embedding space (t-SNE by rule), its answer and rules for one problem
==================== =============================================================================

Every ``plot_*`` function takes plain arrays / mappings and returns a ``matplotlib.figure.Figure`` of fixed
size (nbval compares a figure's ``text/plain`` repr, ``<Figure size WxH with N Axes>``) and never calls
``plt.show()``; notebooks hand it to :func:`rpm_lib.notebook.show`. Accuracies are in percent.
"""
from __future__ import annotations

from rpm_lib.viz.rpm import (  # noqa: F401
    CORRECT_COLOR,
    WRONG_COLOR,
    describe_rules,
    describe_problem_rules,
    plot_rpm,
    GalleryItem,
    plot_gallery,
    dataset_rule_lines,
    rpm_figure,
    rpm_gallery,
    solved_matrix,
    plot_matrices,
)
from rpm_lib.viz.dataset import (  # noqa: F401
    rule_frequencies,
    answer_position_counts,
    plot_rule_frequencies,
    plot_answer_positions,
    indices_by_configuration,
    dataset_summary,
)
from rpm_lib.viz.training_curves import (  # noqa: F401
    history_x,
    plot_history,
    plot_runs_accuracy,
)
from rpm_lib.viz.evaluation import (  # noqa: F401
    CHANCE_PERCENT,
    confusion_matrix,
    plot_accuracy_bars,
    plot_confusion,
    plot_ablation,
    plot_table1_comparison,
    plot_setup_accuracies,
)
from rpm_lib.viz.rule_predictions import (  # noqa: F401
    plot_rule_heatmap,
    plot_per_rule_f1,
    compare_rules,
    rule_comparison_lines,
    sigmoid,
)
from rpm_lib.viz.regimes import (  # noqa: F401
    plot_rule_mix,
    plot_in_vs_out,
)
from rpm_lib.viz.embeddings import (  # noqa: F401
    Agreement,
    ProblemEmbeddings,
    ProblemPrediction,
    correct_completion_embeddings,
    folder_embeddings,
    neighbour_agreement,
    plot_embedding_projection,
    predict_problem,
    project_tsne,
    rule_relations,
    select_problems,
)
from rpm_lib.viz.augmentations import (  # noqa: F401
    describe_applied,
    single_transform_examples,
    recipe_examples,
)

__all__ = [
    "Agreement",
    "CHANCE_PERCENT",
    "CORRECT_COLOR",
    "GalleryItem",
    "ProblemEmbeddings",
    "ProblemPrediction",
    "WRONG_COLOR",
    "answer_position_counts",
    "compare_rules",
    "confusion_matrix",
    "correct_completion_embeddings",
    "dataset_rule_lines",
    "dataset_summary",
    "describe_applied",
    "describe_problem_rules",
    "describe_rules",
    "folder_embeddings",
    "history_x",
    "indices_by_configuration",
    "neighbour_agreement",
    "plot_ablation",
    "plot_accuracy_bars",
    "plot_answer_positions",
    "plot_confusion",
    "plot_embedding_projection",
    "plot_gallery",
    "plot_history",
    "plot_matrices",
    "plot_per_rule_f1",
    "plot_rpm",
    "plot_rule_frequencies",
    "plot_in_vs_out",
    "plot_rule_heatmap",
    "plot_rule_mix",
    "rule_comparison_lines",
    "plot_setup_accuracies",
    "plot_table1_comparison",
    "predict_problem",
    "project_tsne",
    "recipe_examples",
    "rpm_figure",
    "rpm_gallery",
    "rule_frequencies",
    "rule_relations",
    "select_problems",
    "sigmoid",
    "single_transform_examples",
    "solved_matrix",
]
