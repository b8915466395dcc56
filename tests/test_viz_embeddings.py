"""The embedding space of a model (rpm_lib.viz.embeddings): per-problem rule labels, the embedding of each problem's
correct completion, the seeded t-SNE, neighbour agreement, the figure, and one problem's answer and rules."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rpm_lib import rules, viz
from rpm_lib.training import TrainConfig
from rpm_lib.viz.embeddings import ABSENT

SIZE = 24


def _meta(*rows: tuple[int, str, str]) -> np.ndarray:
    """An (8, 9) meta_matrix from (component, relation, attribute) rules, attribute as RavenRule spells it."""
    matrix = np.zeros((8, 9), dtype=np.uint8)
    for component, relation, attribute in rows:
        group = 0 if attribute in ("Number", "Position", rules.NUMBER_POSITION) else rules.RULE_GROUPS.index(attribute)
        row = 4 * component + group
        matrix[row, rules.RELATIONS.index(relation)] = 1
        for name in (("Number", "Position") if attribute == rules.NUMBER_POSITION else (attribute,)):
            matrix[row, 4 + rules.ATTRIBUTES.index(name)] = 1
    return matrix


#: Center: Constant on Number/Position, Progression on Type, Arithmetic on Size, Distribute_Three on Color.
CENTER = _meta((0, "Constant", "Number/Position"), (0, "Progression", "Type"), (0, "Arithmetic", "Size"),
               (0, "Distribute_Three", "Color"))
#: L-R: Left as above but Distribute_Three on Type; Right: Progression on Position, Constant elsewhere.
LEFT_RIGHT = _meta((0, "Constant", "Number/Position"), (0, "Distribute_Three", "Type"), (0, "Arithmetic", "Size"),
                   (0, "Distribute_Three", "Color"), (1, "Progression", "Position"), (1, "Constant", "Type"),
                   (1, "Constant", "Size"), (1, "Arithmetic", "Color"))


def test_rule_relations_reads_each_group_s_relation_of_the_chosen_component() -> None:
    metas = np.stack([CENTER, LEFT_RIGHT])
    assert viz.rule_relations(metas, component=0).tolist() == [[0, 1, 2, 3], [0, 3, 2, 3]]
    # Center has no component 1; the Right's Progression on Position belongs to the Number/Position group
    assert viz.rule_relations(metas, component=1).tolist() == [[ABSENT] * 4, [1, 0, 0, 2]]
    with_mesh = np.concatenate([metas, np.zeros((2, 4, 9), np.uint8)], axis=1)  # (N, 12, 9): no Mesh rows set
    assert viz.rule_relations(with_mesh).tolist() == [[0, 1, 2, 3], [0, 3, 2, 3]]
    bad = CENTER.copy()
    bad[1, 0] = 1  # two relations on one row
    with pytest.raises(ValueError, match="row 1"):
        viz.rule_relations(bad[None])


class FakeModel(torch.nn.Module):
    """``model(panels)``: candidate j's embedding is its panel (8 + j) downsampled to (D,) = (36,); scores prefer
    candidate 3; rule logits (38 sparse slots) are +10 on ``rule_slots``, -10 elsewhere (None: no rule head)."""

    def __init__(self, rule_slots: list[int] | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = TrainConfig(image_size=SIZE, setup="ce_aux_sparse", configurations=["Center", "L-R"])
        self.rule_slots = rule_slots

    @staticmethod
    def candidate_embedding(panels: torch.Tensor) -> torch.Tensor:
        """(..., S, S) uint8 -> (..., 36) float: 6 x 6 mean pooling."""
        x = panels.float() / 255
        return torch.nn.functional.avg_pool2d(x.reshape(-1, 1, SIZE, SIZE), SIZE // 6).reshape(*panels.shape[:-2], 36)

    def forward(self, panels: torch.Tensor) -> dict[str, torch.Tensor]:
        embeddings = self.candidate_embedding(panels[:, 8:])
        scores = torch.zeros(len(panels), 8)
        scores[:, 3] = 1.0
        out = {"embeddings": embeddings + self.weight, "scores": scores}
        if self.rule_slots is not None:
            logits = torch.full((len(panels), 38), -10.0)
            logits[:, self.rule_slots] = 10.0
            out["rule_logits"] = logits
        return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated cache: 10 problems each of Center and L-R (6 train, 2 val, 2 test), 24 px."""
    from rpm_lib.generator.cache_writer import generate_cache

    root = tmp_path_factory.mktemp("embeddings") / "cache"
    generate_cache(root, ["Center", "L-R"], count=10, seed=5, size=SIZE, progress=False)
    return root


def _dataset(folder: Path, split: str = "train"):
    from rpm_lib.training.samples import make_dataset

    return make_dataset(FakeModel().config, split, root=folder)


def test_the_embedding_of_each_problem_is_its_correct_candidate_s(folder: Path) -> None:
    dataset = _dataset(folder)
    indices = [0, 3, 7, 11]
    space = viz.correct_completion_embeddings(FakeModel(), dataset, indices, batch_size=3)
    assert space.embeddings.shape == (4, 36) and space.embeddings.dtype == np.float32
    assert space.relations.shape == (4, 4) and len(space) == 4
    for row, k in enumerate(indices):
        sample = dataset[k]
        expected = FakeModel.candidate_embedding(sample["panels"][8 + int(sample["target"])])
        np.testing.assert_allclose(space.embeddings[row], expected.numpy(), rtol=0, atol=1e-6)
        assert space.target[row] == int(sample["target"]) and space.chosen[row] == 3
        assert space.source_ids[row] == sample["source_id"]
    assert space.configuration_names == ["Center", "Center", "L-R", "L-R"]
    np.testing.assert_array_equal(space.relations, viz.rule_relations(dataset.labels.meta[indices]))


def test_the_rule_labels_agree_with_the_problems_rule_vectors(folder: Path) -> None:
    """Each (group, relation) label has its (relation, attribute) slot set in the sparse-38 vector the dataset gives."""
    dataset = _dataset(folder)
    for component in (0, 1):
        space = viz.correct_completion_embeddings(FakeModel(), dataset, component=component)
        for i, relations in enumerate(space.relations):
            vector = dataset[i]["rules_sparse"].numpy()
            named = set(rules.decode_raven_sparse_rules(vector))
            two_components = len(rules.COMPONENT_NAMES[dataset.labels.group_names[space.configuration[i]]]) == 2
            for group, relation in enumerate(relations):
                if component == 1 and not two_components:
                    assert relation == ABSENT
                    continue
                name = rules.RELATIONS[relation]
                attributes = (("Number", "Position", rules.NUMBER_POSITION) if group == 0
                              else (rules.RULE_GROUPS[group],))
                assert any((component, name, a) in named for a in attributes), (i, component, group, name, named)


def test_folder_embeddings_pick_problems_of_every_split_and_configuration(folder: Path) -> None:
    every = viz.folder_embeddings(FakeModel(), folder)
    assert len(every) == 20 and set(every.configuration_names) == {"Center", "L-R"}
    assert sum(s.endswith("_test") for s in every.source_ids) == 4
    some = viz.folder_embeddings(FakeModel(), folder, max_problems=10)
    assert len(some) == 10 and some.configuration_names.count("Center") == 5
    one = viz.folder_embeddings(FakeModel(), folder, configuration="L-R")
    assert len(one) == 10 and set(one.configuration_names) == {"L-R"}
    np.testing.assert_array_equal(viz.select_problems(np.array([0, 0, 1, 1, 1]), 2, configuration=1), [2, 4])


def test_the_t_sne_is_seeded() -> None:
    x = np.random.default_rng(0).normal(size=(40, 12)).astype(np.float32)
    first = viz.project_tsne(x, seed=1)
    assert first.shape == (40, 2) and first.dtype == np.float32
    np.testing.assert_array_equal(first, viz.project_tsne(x, seed=1))
    with pytest.raises(ValueError, match="N >= 2"):
        viz.project_tsne(x[:1])


def test_neighbour_agreement_against_chance() -> None:
    # two far-apart clusters, each one relation: every neighbour agrees; random neighbours agree 9/19 of the time
    x = np.concatenate([np.zeros((10, 3)), np.full((10, 3), 100.0)]) + np.random.default_rng(0).normal(size=(20, 3))
    labels = np.stack([np.repeat([0, 1], 10), np.repeat([0, 1], 10)[::-1], np.zeros(20, int), np.full(20, ABSENT)], 1)
    result = viz.neighbour_agreement(x, labels, k=5)
    assert result.k == 5
    np.testing.assert_allclose(result.agreement[:3], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(result.chance[:3], [2 * 10 * 9 / (20 * 19), 2 * 10 * 9 / (20 * 19), 1.0])
    assert np.isnan(result.agreement[3]) and np.isnan(result.chance[3])
    shuffled = viz.neighbour_agreement(x, np.stack([np.tile([0, 1], 10)] * 4, 1), k=5)
    assert shuffled.agreement[0] < 0.7


def test_the_projection_has_one_panel_per_rule_group() -> None:
    rng = np.random.default_rng(0)
    points, relations = rng.normal(size=(30, 2)), rng.integers(0, 4, size=(30, 4))
    relations[:5] = ABSENT
    fig = viz.plot_embedding_projection(points, relations, title="t")
    assert [ax.get_title() for ax in fig.axes] == list(rules.RULE_GROUPS)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    counts = {name: int((relations[:, 0] == r).sum()) for r, name in enumerate(rules.RELATIONS)}
    assert legend == [f"{name} ({n})" for name, n in counts.items() if n] + ["no such component (5)"]
    configurations = ["Center"] * 10 + ["L-R"] * 20
    scores = viz.neighbour_agreement(points, relations, k=3)
    fig = viz.plot_embedding_projection(points, relations, configurations=configurations, scores=scores)
    assert len(fig.axes) == 5 and fig.axes[-1].get_title() == "configuration"
    assert fig.axes[1].get_title().startswith("Type\nsame rule as its 3 nearest neighbours: ")
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()] == ["Center (10)", "L-R (20)"]
    with pytest.raises(ValueError, match="relations"):
        viz.plot_embedding_projection(points, relations[:, :3])


def test_predict_problem_decodes_the_rule_head_with_the_model_s_encoding(folder: Path) -> None:
    dataset = _dataset(folder, "test")
    index = 2  # an L-R problem: components named Left and Right
    sample = dataset[index]
    true_slots = np.flatnonzero(sample["rules_sparse"].numpy()).tolist()
    encoding = FakeModel().config.rule_spec
    truth = encoding.decode(sample["rules_sparse"].numpy(), configuration="L-R")
    exact = viz.predict_problem(FakeModel(true_slots), dataset, index)
    assert exact.true_rules == exact.predicted_rules == truth
    assert any(line.startswith("Left: ") for line in truth) and any(line.startswith("Right: ") for line in truth)
    assert all(line.startswith("ok ") for line in exact.rule_lines)
    assert exact.chosen == 3 and exact.target == int(sample["target"])
    assert exact.summary.startswith(f"{sample['source_id']} (answer {exact.target}, chosen 3: ")
    # the Right's last rule left out (never half of the joint Constant on Number/Position: the Right has a rule on
    # Type, Size or Color, whose slots come later), a rule of the Left's added (not a Constant Number / Position bit)
    added = next(j for j in range(2, 19) if j not in true_slots)
    missed = viz.predict_problem(FakeModel(true_slots[:-1] + [added]), dataset, index)
    marks = [line.split()[0] for line in missed.rule_lines]
    assert (marks.count("ok"), marks.count("missing"), marks.count("extra")) == (len(truth) - 1, 1, 1)
    assert missed.rule_lines[-1].endswith(encoding.decode(np.eye(38)[added], configuration="L-R")[0])
    headless = viz.predict_problem(FakeModel(None), dataset, index)
    assert headless.predicted_rules is None and headless.rule_lines is None and headless.true_rules == truth
