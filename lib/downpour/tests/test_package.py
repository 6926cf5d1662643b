"""downpour without a cluster: the package's import order and dependencies, the job's checks, checkpoints written
atomically and checked on resume, which errors mean a lost ps, exact versions under concurrent pushes, the optimizer
on the ps and the bind address (sparse gradients, inputs and data: test_models_and_data.py)."""

import ast
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import downpour
from downpour import DownpourConfig, PsVariables, build_model, faults
from downpour import bind as bind_address
from downpour.checkpoints import CheckpointStore, ResumeRefused
from downpour.local import free_ports
from downpour.variables import count_update

LIB = Path(downpour.__file__).parent
MLP = "downpour.examples:mnist_mlp"


# -- the package ------------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("downpour"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            found |= {n for n in names if n in downpour.MODULES} or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("downpour")}
    return found - {"downpour"}


def test_every_module_imports_only_modules_listed_before_it_so_there_is_no_cycle():
    files = ({p.stem: p for p in LIB.glob("*.py") if p.stem != "__init__"}
             | {"examples": LIB / "examples" / "__init__.py"})
    assert {f"downpour.{name}" for name in files} == set(downpour.MODULES)
    for position, module in enumerate(downpour.MODULES):
        later = set(downpour.MODULES[position:])
        assert not _imports(files[module.rpartition(".")[2]]) & later, module


def test_the_package_needs_tensorflow_keras_numpy_and_freezing_only():
    """A package of its own: no module imports the study (or anything but the standard library, TensorFlow, Keras,
    NumPy and ``freezing``; the tabular example's data also scikit-learn, its ``examples`` extra), and its project
    declares exactly those it needs besides TensorFlow's build, and ships its LICENSE."""
    import importlib.metadata

    allowed = {"downpour", "tensorflow", "keras", "numpy", "freezing", *sys.stdlib_module_names}
    for path in [*LIB.glob("*.py"), *LIB.glob("examples/**/*.py")]:
        may = allowed | ({"sklearn"} if path.parts[-3:] == ("examples", "tabular", "data.py") else set())
        tops = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                tops.add(node.module.split(".")[0])
        assert tops <= may, (path.name, tops - may)
    # what is installed says so (editable here, or a wheel in a clean venv: make test-downpour)
    meta = importlib.metadata.metadata("freezing-downpour")  # PyPI's "downpour" is another project
    requires = meta.get_all("Requires-Dist")

    def name(requirement: str) -> str:
        return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)

    assert sorted(name(r) for r in requires if "extra ==" not in r) == ["freezing", "keras", "numpy"], requires
    assert "scikit-learn" in [name(r) for r in requires if 'extra == "examples"' in r], requires
    assert meta["Version"] == downpour.__version__ and re.fullmatch(r"\d+\.\d+\.\d+", downpour.__version__)
    assert "Apache License" in (LIB / "LICENSE").read_text()[:200]
    assert "An asynchronous parameter server" in (meta["Description"] or meta.get_payload())  # README.md


def test_the_dependency_free_modules_examples_run_and_a_failed_write_leaves_the_old_file(tmp_path):
    import doctest

    from downpour import checks, jsonio

    for module in (checks, jsonio):
        failed, tried = doctest.testmod(module)
        assert tried > 0 and failed == 0, module.__name__
    target = tmp_path / "a.json"
    jsonio.write_json_atomic(target, {"v": 1})

    def broken(tmp: str) -> None:
        Path(tmp).write_text('{"v": 2')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        jsonio.atomic_write(target, broken)
    assert jsonio.read_json(target) == {"v": 1} and [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_ps_or_worker_task_loads_no_keras_and_the_old_modules_are_gone():
    code = "import sys, downpour.roles, downpour.cluster; print('keras' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stderr[-500:]
    study = LIB.parent / "study"  # the package lived in the study as study.ps, and before that in these modules
    assert not (study / "ps").exists()
    for old in ("parameter_server", "ps_roles", "ps_chief", "ps_config", "ps_variables", "ps_examples", "cluster"):
        assert not (study / f"{old}.py").exists()


@pytest.mark.parametrize("bad, match", [
    ({"optimizer": "adamx"}, r"optimizer: got 'adamx'; allowed: 'sgd', 'adagrad' \(Downpour's\), a Keras optimizer"),
    ({"optimizer": {"class_name": "NoSuchOptimizer"}}, "optimizer: .* is not a Keras optimizer config"),
    ({"loss": "no_such_loss"}, "loss: 'no_such_loss' is not a Keras loss"),
    ({"data": "downpour.data:nothing"}, "data: 'downpour.data' has no callable 'nothing'"),
    ({"freeze": ["fc1"]}, "freeze/masks: need a Keras optimizer on the ps"),
    ({"freeze": "fc1", "optimizer": "adam"}, "freeze: expected a list of variable paths"),
    ({"mask_policy": "keep", "optimizer": "adam"}, "mask_policy: got 'keep'; allowed: 'hold', 'reset', 'none'"),
    ({"masks": "nowhere:fn", "optimizer": "adam"}, "masks: cannot import 'nowhere'"),
    ({"local_learning_rate": -1.0}, "local_learning_rate: expected a number in"),
])
def test_bad_job_fields_name_the_field_and_what_is_allowed(bad, match):
    with pytest.raises(ValueError, match=match):
        DownpourConfig(**bad)


def test_freeze_and_masks_that_match_no_variable_are_clear_errors():
    model = build_model(DownpourConfig(model=MLP, model_kwargs={"hidden": 4}))
    with pytest.raises(ValueError, match=r"freeze: 'fc9' matches no trainable variable; paths: \['bn1/beta'"):
        PsVariables(model, DownpourConfig(model=MLP, optimizer="adam", freeze=["fc9"]))
    with pytest.raises(ValueError, match=r"masks: the mask of 'fc1/kernel' has shape \(3,\), which does not broadcast"):
        PsVariables(model, DownpourConfig(model=MLP, optimizer="adam", masks="downpour.tests.ps_hooks:bad_shape"))


# -- data ---------------------------------------------------------------------------------------------------


def test_each_worker_reads_every_workers_th_row_and_a_self_sharding_function_gets_its_index(tmp_path):
    from downpour.data import INDEX_STRIDE, train_dataset, write_idx

    images = np.arange(10 * 4, dtype=np.uint8).reshape(10, 2, 2)
    write_idx(tmp_path, images, np.arange(10), images[:2], np.arange(2))
    job = DownpourConfig(data="downpour.data:idx", data_kwargs={"folder": str(tmp_path), "height": 2, "width": 2},
                         batch=5, shuffle_buffer=1)
    x, y, ids = next(iter(train_dataset(job)(tf.constant(1), 2)))
    assert ids.numpy().tolist() == y.numpy().tolist() == [1, 3, 5, 7, 9]
    np.testing.assert_array_equal(x.numpy()[:, :, :, 0], (images[1::2] / 255.0).astype(np.float32))  # as load_mnist
    job = DownpourConfig(data="downpour.tests.ps_hooks:per_worker", batch=3, shuffle_buffer=1)
    x, y, ids = next(iter(train_dataset(job)(tf.constant(2), 4)))
    assert y.numpy().tolist() == [200, 201, 202] and ids.numpy().tolist() == [2 * INDEX_STRIDE + i for i in range(3)]


# -- the optimizer on the ps, locally -----------------------------------------------------------------------


def test_a_keras_optimizer_on_the_ps_writes_what_keras_writes_and_masks_hold_frozen_entries_exactly():
    job = DownpourConfig(model=MLP, model_kwargs={"hidden": 8, "batch_norm": False}, learning_rate=0.01,
                         optimizer={"class_name": "AdamW", "config": {"weight_decay": 0.1}})
    model = build_model(job)
    ps = PsVariables(model, job)
    reference = [tf.Variable(v.numpy()) for v in model.trainable_variables]
    adamw = keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.1)
    step = tf.function(lambda grads: adamw.apply_gradients(zip(grads, reference)))  # the ps applies in a graph too
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in reference]
        ps.push(grads, [])
        step(grads)
    for mine, theirs in zip(ps.values(), reference):
        np.testing.assert_array_equal(mine, theirs.numpy())

    masked = DownpourConfig(model=MLP, model_kwargs={"hidden": 8, "batch_norm": False}, optimizer="adam",
                            freeze=["fc2/bias"], masks="downpour.examples:random_mask",
                            masks_kwargs={"layer": "fc1", "keep": 0.5})
    ps = PsVariables(build_model(masked), masked)
    before = ps.values()
    for _ in range(3):
        ps.push([tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in before], [])
    keep = {ps.paths[i]: np.broadcast_to(k, before[i].shape) for i, k in ps.masks.items()}
    assert set(keep) == {"fc1/kernel", "fc2/bias"} and 0.3 < keep["fc1/kernel"].mean() < 0.7
    for path, b, v in zip(ps.paths, before, ps.values()):
        changed = b.view(np.uint32) != v.view(np.uint32)
        frozen = ~keep[path] if path in keep else np.zeros(b.shape, bool)
        assert not changed[frozen].any(), path  # 0 bits changed in frozen entries
        assert changed[~frozen].all(), path  # every other entry moved


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_the_update_counter_gives_every_concurrent_caller_its_own_value():
    version = tf.Variable(0, dtype=tf.int64)
    count = tf.function(lambda: count_update(version))
    seen: list[int] = []

    def caller() -> None:
        for _ in range(3000):
            seen.append(int(count()))

    threads = [threading.Thread(target=caller) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 48001))  # assign_add and a read of it gave duplicates here (18 in 48000)


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_concurrent_pushes_each_get_their_own_version():
    job = DownpourConfig(model=MLP, model_kwargs={"hidden": 1, "batch_norm": False}, learning_rate=0.01)
    ps = PsVariables(build_model(job), job)
    grads = [tf.zeros(v.shape) for v in ps.values()]
    push = tf.function(lambda: ps.push(grads, [])[0])
    push()
    versions: list[int] = []

    def pusher() -> None:
        for _ in range(500):
            versions.append(int(push()))

    threads = [threading.Thread(target=pusher) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == list(range(2, 8002))  # no two pushes share a version; none is skipped


# -- checkpoints ------------------------------------------------------------------------------------------


def _state(tmp_path: Path, job: dict | None = None) -> tuple[CheckpointStore, tf.train.Checkpoint, tf.Variable]:
    version = tf.Variable(0, dtype=tf.int64)
    weights = tf.Variable(np.zeros(4, np.float32))
    return CheckpointStore(tmp_path, keep=2, job=job or {"model": "m"}), \
        tf.train.Checkpoint(version=version, weights=weights), version


def test_checkpoints_round_trip_and_only_the_last_two_are_kept(tmp_path):
    store, ckpt, version = _state(tmp_path)
    assert store.latest() is None
    for v in (3, 6, 9):
        version.assign(v)
        store.save(ckpt, v, {"records": [v]})
    assert len(list(tmp_path.glob("ckpt-*"))) == 2
    version.assign(0)
    assert store.restore(ckpt, version) == (9, {"records": [9]})
    assert int(version.numpy()) == 9


@pytest.mark.parametrize("crash_at", ["checkpoint", "sidecar", "rename", "pointer"])
def test_a_save_cut_off_at_any_point_leaves_the_previous_checkpoint_or_the_new_one(tmp_path, monkeypatch, crash_at):
    store, ckpt, version = _state(tmp_path)
    version.assign(5)
    store.save(ckpt, 5, {"at": 5})
    version.assign(8)
    real_replace, real_write = os.replace, Path.write_bytes
    calls = {"replace": 0}

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed here")

    def replace(src, dst):
        calls["replace"] += 1
        if (crash_at, calls["replace"]) in (("rename", 1), ("pointer", 2)):
            crash()
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    if crash_at == "checkpoint":
        monkeypatch.setattr(ckpt, "write", crash)
    if crash_at == "sidecar":
        monkeypatch.setattr(Path, "write_bytes", lambda self, data: crash() if self.name == "state.json"
                            else real_write(self, data))
    with pytest.raises(KeyboardInterrupt):
        store.save(ckpt, 8, {"at": 8})
    monkeypatch.undo()
    prefix, found, state = store.latest()
    assert (found, state) == (5, {"at": 5})  # the pointer still names the previous checkpoint, complete
    version.assign(8)
    store.save(ckpt, 8, {"at": 8})  # and the next save works over the debris
    assert store.latest()[1:] == (8, {"at": 8})


def test_every_start_of_a_chief_is_an_attempt_even_when_two_restore_the_same_checkpoint(tmp_path):
    store, ckpt, version = _state(tmp_path)
    assert store.start_attempt({"resumed": False}, resume=False) == [{"resumed": False}]
    version.assign(8)
    store.save(ckpt, 8, {"at": 8})
    for _ in range(2):  # two restarts before the next checkpoint: both restore update 8, both are kept
        assert store.restore(ckpt, version) == (8, {"at": 8})
        attempts = store.start_attempt({"resumed": True, "restored_version": 8}, resume=True)
    assert attempts == [{"resumed": False}, *[{"resumed": True, "restored_version": 8}] * 2]
    assert json.loads((tmp_path / "attempts.json").read_text()) == attempts  # on disk, for the next chief
    assert store.start_attempt({"resumed": False}, resume=False) == [{"resumed": False}]  # a new job starts afresh


def test_resume_is_refused_with_a_clear_message_when_checkpoint_and_sidecar_disagree(tmp_path):
    store, ckpt, version = _state(tmp_path)
    version.assign(4)
    folder = store.save(ckpt, 4, {"at": 4})
    sidecar = folder / "state.json"
    body = sidecar.read_bytes()
    sidecar.write_bytes(body.replace(b'"at": 4', b'"at": 5'))
    with pytest.raises(ResumeRefused, match="the sidecar of ckpt-000000000004-1 changed after it was written"):
        store.latest()
    sidecar.unlink()
    with pytest.raises(ResumeRefused, match="the checkpoint ckpt-000000000004-1 has no sidecar state.json"):
        store.latest()
    sidecar.write_bytes(body)
    assert store.latest()[1] == 4
    with pytest.raises(ResumeRefused, match=r"written by another job \(differs in \['model'\]\)"):
        CheckpointStore(tmp_path, job={"model": "other"}).latest()
    version.assign(7)  # the checkpoint's counter is 4; make its sidecar claim 7
    store.save(ckpt, 7, {})
    pointer = json.loads((tmp_path / "latest.json").read_text())
    with pytest.raises(ResumeRefused, match="holds update counter 7, its sidecar says 4"):
        lying = tmp_path / pointer["folder"] / "state.json"
        lying.write_bytes(lying.read_bytes().replace(b'"version": 7', b'"version": 4'))
        pointer["version"], pointer["sidecar_sha256"] = 4, __import__("hashlib").sha256(lying.read_bytes()).hexdigest()
        (tmp_path / "latest.json").write_text(json.dumps(pointer))
        store.restore(ckpt, version)
    (tmp_path / "latest.json").unlink()
    with pytest.raises(ResumeRefused, match="holds checkpoint folders but no latest.json"):
        store.latest()


# -- faults -------------------------------------------------------------------------------------------------


class _ClosureError(Exception):
    """Like the coordinator's ClosureInputError: the real error in ``original_exception``."""

    def __init__(self, original: BaseException):
        super().__init__("closure failed")
        self.original_exception = original


@pytest.fixture
def addresses():
    """A ps address that refuses connections and one that accepts them."""
    with socket.socket() as listening:
        listening.bind(("localhost", 0))
        listening.listen()
        yield f"localhost:{free_ports(1)[0]}", f"localhost:{listening.getsockname()[1]}"


def test_a_lost_ps_is_a_typed_connection_error_and_a_port_that_is_down(addresses):
    down, up = addresses
    text = "GRPC error information from remote target /job:ps/replica:0/task:0"
    unavailable = tf.errors.UnavailableError(None, None, text)
    assert faults.lost_ps_tasks(unavailable, [up, down], tries=1) == ["ps:1"]
    assert faults.lost_ps_tasks(_ClosureError(tf.errors.AbortedError(None, None, text)), [down], tries=1) == ["ps:0"]
    assert faults.lost_ps_tasks(unavailable, [up], tries=1) == []  # a typed error, but every ps task answers
    # a shape error or an out-of-memory error on the ps is not a lost ps, whatever its text says
    for error in (tf.errors.InvalidArgumentError(None, None, f"Incompatible shapes. {text}"),
                  tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor. {text}"),
                  RuntimeError(f"PSUnavailableError {text}")):
        assert faults.lost_ps_tasks(error, [down], tries=1) == []
        assert faults.lost_ps_tasks(_ClosureError(error), [down], tries=1) == []


def test_a_call_to_a_dead_peer_ends_at_its_deadline_and_counts_as_a_connection_error(addresses):
    import time

    down, _ = addresses
    started = time.monotonic()
    with pytest.raises(faults.CallTimeout, match=r"^reading the update counter: no answer within 0.2 s$") as caught:
        faults.with_deadline(lambda: time.sleep(30), 0.2, "reading the update counter")
    assert time.monotonic() - started < 5  # the hung call is left behind, not waited for
    assert faults.lost_ps_tasks(caught.value, [down], tries=1) == ["ps:0"]  # its task does not answer: lost
    with pytest.raises(ZeroDivisionError):  # an error inside the call is the call's own
        faults.with_deadline(lambda: 1 / 0, 5.0, "a division")


# -- the bind address ---------------------------------------------------------------------------------------


def test_listening_addresses_are_read_from_proc_and_a_wider_listener_is_refused():
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp on this OS")
    with socket.socket() as wide, socket.socket() as narrow:
        wide.bind(("0.0.0.0", 0))
        wide.listen()
        narrow.bind(("127.0.0.1", 0))
        narrow.listen()
        wide_port, narrow_port = wide.getsockname()[1], narrow.getsockname()[1]
        assert bind_address.listening(wide_port) == ["0.0.0.0"]
        assert bind_address.describe(bind_address.listening(wide_port)) == "every interface (0.0.0.0)"
        bind_address.check_listening(narrow_port, "127.0.0.1")
        with pytest.raises(bind_address.BindError, match=rf"port {wide_port} listens on every interface"):
            bind_address.check_listening(wide_port, "127.0.0.1")
    with pytest.raises(ValueError, match="--bind: expected an IP address of this machine"):
        bind_address.check_address("localhost:2222")


def test_the_walk_through_s_job_file_is_the_one_the_docs_show_and_a_valid_job(monkeypatch):
    text = (LIB / "README.md").read_text()
    shown = json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])
    from downpour.examples import tabular

    job = json.loads(tabular.JOB.read_text())
    assert shown == job
    config = DownpourConfig(**job)
    assert config.optimizer == "adam" and config.freeze == ["encoder"] and config.masked
