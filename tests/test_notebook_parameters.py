"""Hostile notebook parameters: what ``papermill -p`` can pass that ``notebook.check_parameters`` refuses.

Malformed lists, YAML tags, non-finite floats and misspelled names each stop the notebook with one line naming
the parameter; valid text (comma lists, YAML lists) is still read as the declared type. The first tests call
``check_parameters`` with a namespace built by hand (``_ih`` standing for IPython's input history, as in a
kernel); the last ones run real kernels, since only a kernel shows what papermill's injected cell looks like
from inside.
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import nbformat
import pytest

from rpm_lib import notebook

REPO = Path(__file__).resolve().parents[1]
DECLARED = {"ablations": list[str], "threshold": float, "configurations": Optional[list[str]], "seed": int}
KNOWN = "ablations, configurations, seed, threshold"
PARAMETERS_CELL = ("ablations: list[str] = []\nthreshold: float = 0.5\n"
                   "configurations: Optional[list[str]] = None\nseed: int = 0")


def _namespace(injected: str | None = None, **values: Any) -> dict[str, Any]:
    """A notebook's globals after the parameters cell (and papermill's injected cell, when given)."""
    history = ["", "import os", PARAMETERS_CELL]
    if injected is not None:
        history.append(injected)
    history.append("notebook.check_parameters(globals())")
    namespace = {"__annotations__": dict(DECLARED), "ablations": [], "threshold": 0.5, "configurations": None,
                 "seed": 0, "_ih": history, "In": history}
    namespace.update(values)
    return namespace


def _refused(namespace: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ValueError) as caught:
        notebook.check_parameters(namespace, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- text ----------------------------------------------------------------------------------------------------


def test_a_malformed_list_is_refused_not_split_at_its_commas() -> None:
    assert _refused(_namespace(ablations="[a, b")) == (
        "parameter 'ablations': expected list[str], got '[a, b' (not valid YAML: while parsing a flow sequence, "
        "expected ',' or ']', but got '<stream end>')")
    assert _refused(_namespace(configurations="[Center, L-R")) == (
        "parameter 'configurations': expected Optional[list[str]], got '[Center, L-R' (not valid YAML: while "
        "parsing a flow sequence, expected ',' or ']', but got '<stream end>')")


@pytest.mark.parametrize("text", ["a,,b", "a,", "a, ,b"])  # (",a" is not YAML: refused as such)
def test_an_empty_item_in_a_comma_list_is_refused_not_dropped(text: str) -> None:
    assert _refused(_namespace(ablations=text)) == (
        f"parameter 'ablations': empty item in the comma-separated list {text!r} (remove the extra comma)")
    assert _refused(_namespace(configurations=text)).startswith("parameter 'configurations': empty item")


def test_an_empty_text_is_still_an_empty_list() -> None:
    namespace = _namespace(ablations="")
    notebook.check_parameters(namespace)
    assert namespace["ablations"] == []


@pytest.mark.parametrize("text", ["!!python/name:os.system", "!foo bar", "!!python/object/apply:os.system [ls]"])
def test_a_yaml_tag_is_refused_not_kept_as_a_one_item_list(text: str) -> None:
    assert _refused(_namespace(ablations=text)) == (
        f"parameter 'ablations': expected list[str], got {text!r} (YAML tags are not accepted)")


def test_a_tag_for_a_number_is_refused_too() -> None:
    assert _refused(_namespace(seed="!foo 3")) == (
        "parameter 'seed': expected int, got '!foo 3' (YAML tags are not accepted)")


@pytest.mark.parametrize(("value", "shown"), [("nan", "nan"), (".nan", ".nan"), ("inf", "inf"), ("-inf", "-inf"),
                                              ("1e999", "1e999"), (float("nan"), "nan"), (float("-inf"), "-inf")])
def test_a_non_finite_float_is_refused(value: Any, shown: str) -> None:
    # papermill's CLI turns `-p threshold nan` into float('nan'); papermill's API passes the text "nan".
    assert _refused(_namespace(threshold=value)) == f"parameter 'threshold': must be a finite number, got {shown}"


def test_a_parameter_named_in_non_finite_accepts_nan_and_inf() -> None:
    namespace = _namespace(threshold="inf")
    notebook.check_parameters(namespace, non_finite={"threshold"})
    assert namespace["threshold"] == math.inf
    namespace = _namespace(threshold=float("nan"))
    notebook.check_parameters(namespace, non_finite=("threshold",))
    assert math.isnan(namespace["threshold"])


def test_non_finite_must_name_declared_parameters() -> None:
    assert _refused(_namespace(), non_finite={"treshold"}) == (
        "check_parameters(non_finite=...): 'treshold' is not declared in the parameters cell")


def test_valid_text_is_still_read_as_the_declared_type() -> None:
    for text in ("Center,L-R", "Center, L-R", "[Center, L-R]"):
        namespace = _namespace(ablations=text, configurations=text, threshold="0.25", seed="7")
        notebook.check_parameters(namespace)
        assert (namespace["ablations"], namespace["configurations"]) == (["Center", "L-R"], ["Center", "L-R"])
        assert (namespace["threshold"], namespace["seed"]) == (0.25, 7)
    namespace = _namespace(configurations="null", threshold="1e-3")
    notebook.check_parameters(namespace)
    assert namespace["configurations"] is None and namespace["threshold"] == 0.001


# --- names ---------------------------------------------------------------------------------------------------


def test_a_misspelled_injected_name_is_refused_listing_the_known_ones() -> None:
    namespace = _namespace("# Parameters\ntreshold = 0.3\n", treshold=0.3)
    assert _refused(namespace) == (
        "parameter 'treshold' (did you mean 'threshold'?): not a parameter of this notebook, whose parameters are: "
        f"{KNOWN}")


def test_several_unknown_names_are_listed_in_one_line() -> None:
    namespace = _namespace('# Parameters\nseed = 1\nxyz = "a"\nthreshhold = 0.3\n', xyz="a", threshhold=0.3)
    assert _refused(namespace) == (
        "parameters 'xyz', 'threshhold' (did you mean 'threshold'?): not parameters of this notebook, whose "
        f"parameters are: {KNOWN}")


def test_declared_names_and_papermill_paths_in_the_injected_cell_pass() -> None:
    injected = ('# Parameters\nablations = "a, b"\nthreshold = 0.3\n'
                'PAPERMILL_INPUT_PATH = "in.ipynb"\nPAPERMILL_OUTPUT_PATH = "out.ipynb"\n')
    namespace = _namespace(injected, ablations="a, b", threshold=0.3)
    notebook.check_parameters(namespace)
    assert namespace["ablations"] == ["a", "b"] and namespace["threshold"] == 0.3


@pytest.mark.parametrize("previous", [
    PARAMETERS_CELL,  # no papermill: the cell before is the parameters cell itself
    "# Parameters\nprint('not papermill')\ntreshold = 1",  # a cell of the user's own that only looks like it
    "# Parameters\ntreshold: float = 1",
    "treshold = 1",  # an interactive session: the user assigned a name of their own just before
])
def test_without_an_injected_cell_no_name_is_checked(previous: str) -> None:
    namespace = _namespace()
    namespace["_ih"] = namespace["In"] = ["", previous, "notebook.check_parameters(globals())"]
    notebook.check_parameters(namespace)
    del namespace["_ih"], namespace["In"]  # plain Python: no history at all
    notebook.check_parameters(namespace)


# --- real kernels --------------------------------------------------------------------------------------------


def _papermill(*parameters: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`papermill notebooks/05_rule_predictions.ipynb ... -p name value ...` (fails at check_parameters or later)."""
    command = [sys.executable, "-m", "papermill", str(REPO / "notebooks" / "05_rule_predictions.ipynb"),
               str(tmp_path / "out.ipynb"), "-k", "python3", "--no-progress-bar", *parameters]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_papermill_cli_misspelled_name_stops_notebook_05(tmp_path: Path) -> None:
    done = _papermill("-p", "treshold", "0.3", tmp_path=tmp_path)
    assert done.returncode != 0
    assert done.stderr.rstrip().splitlines()[-1] == (
        "ValueError: parameter 'treshold' (did you mean 'threshold'?): not a parameter of this notebook, whose "
        "parameters are: data_root, interactive, max_problems, min_support, num_examples, output_dir, run_dir, "
        "threshold")


def test_papermill_cli_nan_threshold_stops_notebook_05(tmp_path: Path) -> None:
    done = _papermill("-p", "threshold", "nan", tmp_path=tmp_path)
    assert done.returncode != 0
    last_line = done.stderr.rstrip().splitlines()[-1]
    assert last_line == "ValueError: parameter 'threshold': must be a finite number, got nan"


def test_papermill_shows_the_kernel_side_error_as_one_line_without_a_traceback(tmp_path: Path) -> None:
    done = _papermill("-p", "threshold", "nan", tmp_path=tmp_path)
    kernel_part = done.stderr.split('Exception encountered at "In [', 1)[1].strip().splitlines()[1:]
    assert kernel_part == ["ValueError: parameter 'threshold': must be a finite number, got nan"]
    assert "rpm_lib/typed_values.py" not in done.stderr and "Cell In[" not in done.stderr


def test_valid_parameters_pass_through_the_injected_cell(tmp_path: Path) -> None:
    from rpm_lib.notebook_execution import execute_notebook

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%matplotlib inline"),
                nbformat.v4.new_code_cell("ablations: list[str] = []\nthreshold: float = 0.5",
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from rpm_lib import notebook\nnotebook.check_parameters(globals())\n"
                                          "print(ablations, threshold)")]
    nbformat.write(nb, tmp_path / "tiny.ipynb")
    out = execute_notebook(tmp_path / "tiny.ipynb", tmp_path / "out.ipynb", {"ablations": "a, b", "threshold": "0.7"})
    executed = nbformat.read(out, as_version=4)
    assert "injected-parameters" in executed.cells[2].metadata["tags"]
    assert executed.cells[-1].outputs[0]["text"] == "['a', 'b'] 0.7\n"


# --- rpm-notebook: the same execution, one line instead of papermill's own traceback ---------------------------


def _rpm_notebook(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rpm_lib.notebook_cli", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_rpm_notebook_reports_a_failed_cell_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out.ipynb"
    done = _rpm_notebook(str(REPO / "notebooks" / "05_rule_predictions.ipynb"), str(out), "-p", "threshold", "nan",
                         tmp_path=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"rpm-notebook: error: {out}, cell 4: ParameterError: parameter 'threshold': must be a finite number, got nan"]
    assert out.is_file()  # the executed notebook is kept, as papermill keeps it


def test_rpm_notebook_keeps_what_the_kernel_writes_to_its_standard_error_beside_the_output(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("fail: bool = False", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import os\nos.write(2, b'chatter of the kernel\\n')\n"
                                          "if str(fail) == 'true':  # -p values reach an unchecked notebook as text\n"
                                          "    raise ValueError('no good')")]
    nbformat.write(nb, tmp_path / "chatty.ipynb")
    for fail, status in (("false", 0), ("true", 1)):
        out = tmp_path / f"out-{fail}.ipynb"
        done = _rpm_notebook(str(tmp_path / "chatty.ipynb"), str(out), "-p", "fail", fail, tmp_path=tmp_path)
        assert done.returncode == status, done.stderr
        assert "chatter" not in done.stdout + done.stderr
        assert len((done.stdout + done.stderr).strip().splitlines()) == 1, done.stdout + done.stderr
        assert "chatter of the kernel" in (tmp_path / f"out-{fail}.kernel.log").read_text()
    quiet = tmp_path / "quiet.ipynb"
    nb.cells[1].source = "print('nothing on descriptor 2')"
    nbformat.write(nb, quiet)
    assert _rpm_notebook(str(quiet), str(tmp_path / "q.ipynb"), tmp_path=tmp_path).returncode == 0
    log = tmp_path / "q.kernel.log"
    # an empty log is removed; the kernel is shut down only once idle, so its shutdown adds nothing to it
    # (test_notebook_execution.py checks that with a kernel that is slow to become idle)
    assert not log.exists(), log.read_text()


def test_rpm_notebook_refuses_unknown_names_and_bad_files_before_a_kernel_starts(tmp_path: Path) -> None:
    template = str(REPO / "notebooks" / "05_rule_predictions.ipynb")
    done = _rpm_notebook(template, str(tmp_path / "o.ipynb"), "-p", "treshold", "0.3", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"rpm-notebook: error: {template}: no parameter 'treshold' (did you mean 'threshold'?); its parameters are: "
        "data_root, interactive, max_problems, min_support, num_examples, output_dir, run_dir, threshold"]
    assert not (tmp_path / "o.ipynb").exists()
    bad = tmp_path / "params.yaml"
    for text, problem in (("[1, 2]", "expected a mapping of parameter names to values, got list"),
                          ("threshold: [0.3", "not YAML")):
        bad.write_text(text)
        done = _rpm_notebook(template, str(tmp_path / "o.ipynb"), "-f", str(bad), tmp_path=tmp_path)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"rpm-notebook: error: {bad}: {problem}"), done.stderr
    not_a_notebook = tmp_path / "x.ipynb"
    not_a_notebook.write_text("{")
    done = _rpm_notebook(str(not_a_notebook), str(tmp_path / "o.ipynb"), tmp_path=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{not_a_notebook}: not a readable notebook" in done.stderr
