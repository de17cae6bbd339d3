"""notebooks/monitor.ipynb runs headlessly (nbclient) without an error.

The notebook trains two small models on an emulated local cluster (real run logs), so it
takes ~20-30 s.
"""

from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy(14)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "monitor.ipynb"


@pytest.mark.timeout(300)
def test_monitor_notebook_executes(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's run logs (mkdtemp) go here
    # Raises CellExecutionError, with the cell and its traceback, on any error.
    NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "emulated speeds 2:1" in text  # the cluster is the emulated local one
    assert "hmdspt: validation score" in text and "equal: validation score" in text
    assert "proportional: fastest worker idle" in text and "equal: fastest worker idle" in text
    # The dashboard rendered with the JavaScript embedded (pn.extension(inline=True)).
    last = nb.cells[-1].outputs
    assert any("application/vnd.holoviews_exec.v0+json" in o.get("data", {}) for o in last), last
