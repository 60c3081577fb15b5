"""localcluster.build: go.mod versions, build stamps keyed on everything that changes a
binary, and one real (tiny) `go build` through the same path the control plane takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.localcluster.build import (
    Target,
    build_groups,
    build_target,
    go_version,
    gomod_version,
    prometheus_release,
    stamp_key,
    write_stamp,
)
from harness.localcluster.errors import ClusterError
from harness.localcluster.paths import E2E
from harness.localcluster.targets import FOR_TESTS, TARGETS, find_target

GOMOD = """module example.com/wrapper

go 1.22

require k8s.io/kubernetes v1.37.2

require (
\tgo.etcd.io/etcd/server/v3 v3.7.0
\tgithub.com/other/mod v0.1.0 // indirect
)

replace example.com/ignored => ./ignored
"""


def test_gomod_version_single_line_block_and_indirect(tmp_path: Path) -> None:
    gomod = tmp_path / "go.mod"
    gomod.write_text(GOMOD)
    assert gomod_version(gomod, "k8s.io/kubernetes") == "v1.37.2"
    assert gomod_version(gomod, "go.etcd.io/etcd/server/v3") == "v3.7.0"
    assert gomod_version(gomod, "github.com/other/mod") == "v0.1.0"
    with pytest.raises(ClusterError, match=re.escape("does not require example.com/ignored")):
        gomod_version(gomod, "example.com/ignored")  # a replace line is no requirement
    with pytest.raises(ClusterError, match=re.escape("does not require github.com/other")):
        gomod_version(gomod, "github.com/other")  # whole module paths only


def test_every_pinned_target_has_a_version_and_a_cache_dir() -> None:
    for t in TARGETS:
        assert t.version().startswith("v"), t
        assert t.out_dir().name == f"{t.tool}-{t.version()}"
        assert (E2E / t.module_dir / "go.sum").is_file(), t  # -mod=readonly needs it
    assert find_target("kubectl").tool == "kubernetes"
    with pytest.raises(ClusterError, match="unknown binary 'nope'; known: "):
        find_target("nope")


def test_prometheus_module_versions_map_to_releases() -> None:
    assert prometheus_release("v0.316.0") == "3.16.0"
    assert prometheus_release("v0.300.1") == "3.0.1"


def module(tmp_path: Path) -> Target:
    """A wrapper module requiring a local dependency (a replace: no download, no go.sum line)."""
    (tmp_path / "m" / "dep").mkdir(parents=True)
    (tmp_path / "m" / "go.mod").write_text(
        "module example.com/w\n\ngo 1.22\n\nrequire example.com/dep v0.1.0\n\n"
        "replace example.com/dep => ./dep\n"
    )
    (tmp_path / "m" / "go.sum").write_text("")
    (tmp_path / "m" / "main.go").write_text(
        'package main\n\nimport "example.com/dep"\n\nfunc main() { println(dep.Name) }\n'
    )
    (tmp_path / "m" / "dep" / "go.mod").write_text("module example.com/dep\n\ngo 1.22\n")
    (tmp_path / "m" / "dep" / "dep.go").write_text('package dep\n\nconst Name = "w"\n')
    return Target("w", "m", "example.com/dep", {"w": "example.com/w"}, e2e_dir=tmp_path,
                  bin_root=tmp_path / "bin")  # fmt: skip


def test_the_stamp_key_covers_module_files_go_version_binaries_and_tags(tmp_path: Path) -> None:
    t = module(tmp_path)
    go = "go version go1.26.0 linux/amd64"
    key = t.stamp_key(go)
    assert key == stamp_key(t.module_path(), t.binaries, "", go)  # deterministic
    assert t.stamp_key("go version go1.26.1 linux/amd64") != key
    assert stamp_key(t.module_path(), t.binaries, "remove_all_sd", go) != key
    assert stamp_key(t.module_path(), {**t.binaries, "x": "example.com/w/x"}, "", go) != key
    assert stamp_key(t.module_path(), t.binaries, "", go, recipe="other") != key

    out = t.out_dir()
    assert out == tmp_path / "bin" / "w-v0.1.0"
    out.mkdir(parents=True)
    write_stamp(out, key, go)
    assert not t.is_current(go)  # stamped, but the binary is missing
    (out / "w").write_bytes(b"")
    assert t.is_current(go)
    assert not t.is_current("go version go1.26.1 linux/amd64")  # a new toolchain rebuilds

    gosum = t.module_path() / "go.sum"
    gosum.write_text("example.com/x v1.0.0 h1:AAAA=\n")
    assert not t.is_current(go)  # a changed go.sum rebuilds
    gosum.write_text("")
    assert t.is_current(go)
    (t.module_path() / "go.mod").write_text(
        (t.module_path() / "go.mod").read_text() + "\n// edited\n"
    )
    assert not t.is_current(go)  # so does a changed go.mod

    main = t.module_path() / "main.go"
    main.write_text(main.read_text() + "\n// edited\n")
    assert not t.is_current(go)  # the module's own sources key it too (the picker's are)
    (t.module_path() / "main_test.go").write_text("package main\n")
    assert t.stamp_key(go) == stamp_key(t.module_path(), t.binaries, "", go)
    changed = t.stamp_key(go)
    (t.module_path() / "main_test.go").write_text("package main\n\n// edited\n")
    assert t.stamp_key(go) == changed  # tests do not change the binary

    (out / ".stamp").write_text("{not json")
    assert not t.is_current(go)


def test_a_real_build_is_stamped_then_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = module(tmp_path)
    assert not t.is_current()
    build_target(t, 1, 1, 0.0)
    assert (t.out_dir() / "w").is_file()
    assert t.is_current()  # stamped with this machine's `go version`
    assert go_version() in (t.out_dir() / ".stamp").read_text()
    capsys.readouterr()
    build_target(t, 1, 1, 0.0)
    assert f"(1/1) w v0.1.0: cached in {t.out_dir()}" in capsys.readouterr().err


def test_tests_build_every_on_request_binary_they_use() -> None:
    """`e2e/cluster build` (what CI runs first) skips the optional targets, so a test that
    takes one with `binary()` passes only on a machine where an earlier session happened to
    build it, and fails on a fresh one (found by a cold CI run: prometheus-adapter). Such
    binaries go through `built_binary()`, which builds them once on request."""
    on_request = {b for t in TARGETS if t.optional for b in t.binaries}
    assert on_request, "no optional target left: this check has nothing to guard"
    plain_use = re.compile(r"""(?<![_\w])binary\(\s*["']([\w-]+)["']\s*\)""")
    offenders = [
        f"{path.relative_to(E2E.parent)}: binary({name!r})"
        for tree in (E2E, E2E.parent / "tests", E2E.parent / "bench")
        for path in tree.rglob("*.py")
        for name in plain_use.findall(path.read_text(encoding="utf-8"))
        if name in on_request
    ]
    assert offenders == [], f"use built_binary() for on-request binaries: {offenders}"


def test_the_set_up_builds_every_on_request_binary_the_tests_use() -> None:
    """scripts/test runs `e2e/cluster build --for-tests` beside its downloads, so no test
    spends its set-up compiling (Prometheus cost the alert-rule tests 130 s, the adapter
    the HPA test 109 s): every `built_binary(NAME)` a test or bench uses is in FOR_TESTS."""
    used = re.compile(r"""built_binary\(\s*["']([\w-]+)["']\s*\)""")
    names = {
        name
        for tree in (E2E, E2E.parent / "tests", E2E.parent / "harness")
        for path in tree.rglob("*.py")
        for name in used.findall(path.read_text(encoding="utf-8"))
    }
    assert names, "no built_binary() use found: this check has nothing to guard"
    assert names <= set(FOR_TESTS), f"add to FOR_TESTS: {sorted(names - set(FOR_TESTS))}"
    assert all(find_target(b).optional for b in FOR_TESTS)  # the defaults are built anyway


def test_one_go_build_per_target_where_go_names_the_binaries_as_we_do() -> None:
    kube = find_target("kubectl").binaries
    assert build_groups(kube) == [kube]  # four binaries, one invocation
    etcd = {"etcd": "go.etcd.io/etcd/server/v3"}  # Go would call it `server`
    assert build_groups(etcd) == [etcd]
    mixed = {"a": "example.com/w/cmd/a", "b": "example.com/w/cmd/b", "c": "example.com/w/v2"}
    assert build_groups(mixed) == [{"a": mixed["a"], "b": mixed["b"]}, {"c": mixed["c"]}]


def test_a_real_build_of_two_binaries_in_one_invocation(tmp_path: Path) -> None:
    t = module(tmp_path)
    for name in ("one", "two"):
        (t.module_path() / "cmd" / name).mkdir(parents=True)
        (t.module_path() / "cmd" / name / "main.go").write_text(
            f'package main\n\nfunc main() {{ println("{name}") }}\n'
        )
    two = {"one": "example.com/w/cmd/one", "two": "example.com/w/cmd/two"}
    t = Target("w2", "m", "example.com/dep", two, e2e_dir=tmp_path, bin_root=tmp_path / "bin")
    build_target(t, 1, 1, 0.0)
    assert sorted(p.name for p in t.out_dir().iterdir()) == [".stamp", "one", "two"]
    assert t.is_current()
