"""Security: TLS on the cluster, the monitor's login, no unpickling of what the app reads,
and a safe format for fitted models (docs/security.md)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from distributed import Client
from sklearn.datasets import load_digits, make_classification

from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel.cluster import local_cluster

pytestmark = pytest.mark.heavy(5)  # TLS clusters and served monitors

ROOT = Path(__file__).resolve().parents[1]

#: Types a fitted BPNNClassifier holds besides builtins and numpy arrays; the only
#: ones to pass as ``trusted`` to ``skops.io.load`` (see docs/security.md).
SKOPS_TRUSTED = [  # sorted, as the test compares it with skops' sorted list
    "hmdspt.core.nn.AdamOptimizer",
    "hmdspt.core.nn.MLP",
    "hmdspt.estimator.BPNNClassifier",
    "numpy.dtype",
]


@pytest.fixture(scope="module")
def digits_model():
    X, y = load_digits(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = BPNNClassifier((16,), max_iter=5, random_state=0).fit(X, y)
    return clf, X


def test_a_fit_runs_end_to_end_over_tls(tmp_path):
    from distributed.security import Security

    sec = Security.temporary()  # a throw-away CA and certificate, in memory
    assert sec.require_encryption
    X, y = make_classification(
        n_samples=3000, n_features=20, n_classes=3, n_informative=8, random_state=0
    )
    with local_cluster(speeds=(2, 1), security=sec, protocol="tls://", processes=False) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        with Client(cluster, security=sec) as client:
            info = client.scheduler_info(n_workers=-1)
            assert all(a.startswith("tls://") for a in info["workers"])
            clf = BPNNClassifier(
                (32,),
                client=client,
                max_iter=3,
                rounds_per_epoch=2,
                run_log=tmp_path,
                random_state=0,
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                clf.fit(X[:2400], y[:2400], eval_set=(X[2400:], y[2400:]))
    assert clf.score(X[2400:], y[2400:]) > 0.5
    from hmdspt.core.runlog import read_events

    events = read_events(clf.run_log_path_)
    assert events[-1]["status"] == "completed"
    assert all(w["address"].startswith("tls://") for w in events[0]["workers"])


def test_a_plain_client_cannot_talk_to_a_tls_cluster():
    from distributed.security import Security

    sec = Security.temporary()
    with local_cluster(speeds=(1,), security=sec, protocol="tls://", processes=False) as cluster:
        plain = cluster.scheduler_address.replace("tls://", "tcp://")
        with pytest.raises((OSError, TimeoutError)):
            Client(plain, timeout=2)


def test_monitor_passes_basic_auth_and_cookie_secret_to_panel(tmp_path, monkeypatch):
    import panel as pn

    from hmdspt.app.cli import monitor_main

    calls = []
    monkeypatch.setattr(pn, "serve", lambda *a, **kw: calls.append(kw))
    assert monitor_main(tmp_path, port=1, basic_auth="s3cret", cookie_secret="c00kie") == 0
    assert calls[-1]["basic_auth"] == "s3cret" and calls[-1]["cookie_secret"] == "c00kie"
    assert calls[-1]["address"] == "127.0.0.1"
    # A password without a cookie secret: a random secret, different per start.
    monitor_main(tmp_path, port=1, basic_auth="s3cret")
    monitor_main(tmp_path, port=1, basic_auth="s3cret")
    secrets = [c["cookie_secret"] for c in calls[-2:]]
    assert len(set(secrets)) == 2 and all(len(s) >= 32 for s in secrets)
    # No password: no login at all (the default, local-only monitor).
    monitor_main(tmp_path, port=1)
    assert "basic_auth" not in calls[-1] and calls[-1]["address"] == "127.0.0.1"


def test_monitor_warns_when_exposed_without_a_password(tmp_path, monkeypatch, capsys):
    import panel as pn

    from hmdspt.app.cli import monitor_main

    monkeypatch.setattr(pn, "serve", lambda *a, **kw: None)
    monitor_main(tmp_path, port=1, address="0.0.0.0")
    assert "without --basic-auth" in capsys.readouterr().err
    monitor_main(tmp_path, port=1, address="0.0.0.0", basic_auth="pw")
    assert "without --basic-auth" not in capsys.readouterr().err


def test_the_app_and_the_run_log_reader_never_unpickle():
    import hmdspt.app
    import hmdspt.core.runlog

    app_files = Path(hmdspt.app.__file__).parent.rglob("*.py")
    files = sorted(app_files) + [Path(hmdspt.core.runlog.__file__)]
    pattern = re.compile(
        r"\bimport pickle\b|\bpickle\.|cloudpickle|\bjoblib\.load|allow_pickle\s*=\s*True"
        r"|pd\.read_pickle|\bmarshal\.|\bshelve\b|yaml\.load\(|\beval\("
    )
    hits = [
        f"{f}:{i}: {line.strip()}"
        for f in files
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


def test_a_fitted_model_round_trips_through_skops(digits_model, tmp_path):
    import skops.io as sio

    clf, X = digits_model
    path = tmp_path / "model.skops"
    sio.dump(clf, path)
    assert sorted(sio.get_untrusted_types(file=path)) == SKOPS_TRUSTED
    with pytest.raises(Exception, match="[Uu]ntrusted"):
        sio.load(path)  # nothing beyond builtins/numpy is loaded unless listed
    loaded = sio.load(path, trusted=SKOPS_TRUSTED)
    assert (loaded.predict(X) == clf.predict(X)).all()
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_a_model_fitted_on_a_cluster_round_trips_without_its_client(tmp_path):
    import skops.io as sio

    X, y = make_classification(n_samples=1500, n_features=10, random_state=0)
    with local_cluster(speeds=(1,), processes=False) as cluster, Client(cluster) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = BPNNClassifier((8,), client=client, max_iter=2, random_state=0).fit(X, y)
        path = tmp_path / "m.skops"
        sio.dump(clf, path)  # with the live client set: it is not saved
    assert set(sio.get_untrusted_types(file=path)) <= set(SKOPS_TRUSTED)
    loaded = sio.load(path, trusted=SKOPS_TRUSTED)
    assert loaded.client is None
    assert (loaded.predict(X) == clf.predict(X)).all()


def save_npz(clf: BPNNClassifier, path: Path) -> None:
    """The pickle-free fallback format: weights, biases and classes in one ``.npz``."""
    # coefs_/intercepts_ (views into the flat parameter vector), or the model's own lists.
    coefs = getattr(clf, "coefs_", None) or clf._model.coefs
    intercepts = getattr(clf, "intercepts_", None) or clf._model.intercepts
    arrays = {f"coef_{i}": c for i, c in enumerate(coefs)}
    arrays |= {f"intercept_{i}": b for i, b in enumerate(intercepts)}
    np.savez(path, classes=clf.classes_, **arrays)


def predict_npz(path: Path, X: np.ndarray, activation: str = "relu") -> np.ndarray:
    """Predict from :func:`save_npz` output with numpy only (``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as data:
        n = sum(k.startswith("coef_") for k in data.files)
        a = np.asarray(X, dtype=np.float64)
        for i in range(n):
            a = a @ data[f"coef_{i}"] + data[f"intercept_{i}"]
            if i < n - 1:
                a = np.maximum(a, 0) if activation == "relu" else np.tanh(a)
        return data["classes"][a.argmax(1)]


def test_npz_of_coefs_and_intercepts_is_a_safe_fallback(digits_model, tmp_path):
    clf, X = digits_model
    assert clf.activation == "relu"
    path = tmp_path / "model.npz"
    save_npz(clf, path)
    assert (predict_npz(path, X) == clf.predict(X)).mean() > 0.99


# --------------------------------------------------------------------------------------
# The monitor's login over real HTTP (issue 14, defect 8)
# --------------------------------------------------------------------------------------


def _login(srv, user: str, password: str) -> tuple[int, str, list[str]]:
    """POST the login form; returns the status, where it redirects and the cookies set."""
    from urllib.parse import urlencode

    status, headers, _ = srv.request(
        "POST",
        "/login",
        urlencode({"username": user, "password": password}),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    return status, headers.get("location", [""])[0], headers.get("set-cookie", [])


def _logged_in(srv, cookies: list[str]) -> bool:
    """Whether the page itself is served with these cookies (not a redirect to /login)."""
    jar = "; ".join(c.split(";", 1)[0] for c in cookies)
    status, headers, body = srv.request("GET", "/", headers={"Cookie": jar})
    return status == 200 and b"bokeh" in body.lower()


def test_monitor_basic_auth_file_of_user_password_lines_works_over_http(tmp_path):
    """The documented ``user:password`` file: only a listed user with its password gets in."""
    from tests.test_monitor_robustness import ServedMonitor

    (tmp_path / "runs").mkdir()
    pw = tmp_path / "monitor.passwd"
    pw.write_text("# who may look\nalice:s3cret\n\nbob:pa:ss word\n")
    with ServedMonitor(tmp_path / "runs", "--basic-auth", str(pw), log_dir=tmp_path / "a") as srv:
        status, headers, _ = srv.request("GET", "/")
        assert status == 302 and "login" in headers["location"][0]  # no page before a login
        for user, password in (("alice", "s3cret"), ("bob", "pa:ss word")):
            status, where, cookies = _login(srv, user, password)
            assert status == 302 and "error" not in where, (user, status, where)
            assert _logged_in(srv, cookies)
        for user, password in (("alice", "pa:ss word"), ("mallory", "s3cret"), ("alice", "")):
            status, where, cookies = _login(srv, user, password)
            assert status == 302 and "error=" in where, (user, status, where)
            assert not _logged_in(srv, cookies)
        assert " 500 " not in srv.stderr() and "Traceback" not in srv.stderr(), srv.stderr()


def test_monitor_basic_auth_bare_password_admits_any_user_name(tmp_path):
    """A password on the command line (documented so): any user name with it gets in."""
    from tests.test_monitor_robustness import ServedMonitor

    (tmp_path / "runs").mkdir()
    with ServedMonitor(tmp_path / "runs", "--basic-auth", "s3cret", log_dir=tmp_path / "s") as srv:
        for user in ("alice", "anyone"):
            status, where, cookies = _login(srv, user, "s3cret")
            assert status == 302 and "error" not in where and _logged_in(srv, cookies)
        status, where, cookies = _login(srv, "alice", "wrong")
        assert "error=" in where and not _logged_in(srv, cookies)


@pytest.mark.parametrize(
    "content, problem",
    [
        ("", "no user:password line"),
        ("# only a comment\n\n", "no user:password line"),
        ("alice:s3cret\njustapassword\n", "line 2 is not user:password"),
        (":s3cret\n", "line 1 has an empty user name"),
        ("alice:\n", "line 1 has an empty password"),
        ("alice:a\nalice:b\n", "line 2 repeats the user alice"),
        (b"alice:\xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_monitor_refuses_a_malformed_basic_auth_file(tmp_path, monkeypatch, capsys, content,
                                                     problem):  # fmt: skip
    import panel as pn

    from hmdspt.app.cli import monitor_main

    calls = []
    monkeypatch.setattr(pn, "serve", lambda *a, **kw: calls.append(kw))
    pw = tmp_path / "monitor.passwd"
    pw.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert monitor_main(tmp_path, port=1, basic_auth=str(pw)) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and problem in err and str(pw) in err, err
    assert "s3cret" not in err and not calls  # the password is never echoed; nothing served


def test_monitor_refuses_a_basic_auth_path_that_does_not_exist(tmp_path, monkeypatch, capsys):
    """A missing file is not silently taken as the password (the file's name)."""
    import panel as pn

    from hmdspt.app.cli import monitor_main

    monkeypatch.setattr(pn, "serve", lambda *a, **kw: None)
    assert monitor_main(tmp_path, port=1, basic_auth=str(tmp_path / "missing.passwd")) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no password file" in err, err
    assert "missing.passwd" not in err  # never echoed: it might be a password after all


def test_monitor_warns_about_a_password_file_others_can_read(tmp_path, monkeypatch, capsys):
    import panel as pn

    from hmdspt.app.cli import monitor_main

    calls = []
    monkeypatch.setattr(pn, "serve", lambda *a, **kw: calls.append(kw))
    pw = tmp_path / "monitor.passwd"
    pw.write_text("alice:s3cret\n")
    pw.chmod(0o644)
    assert monitor_main(tmp_path, port=1, basic_auth=str(pw)) == 0
    assert "readable by other users" in capsys.readouterr().err
    assert calls[-1]["basic_auth"] == {"alice": "s3cret"}  # a dict: no file for Panel
    pw.chmod(0o600)
    assert monitor_main(tmp_path, port=1, basic_auth=str(pw)) == 0
    assert "readable" not in capsys.readouterr().err
