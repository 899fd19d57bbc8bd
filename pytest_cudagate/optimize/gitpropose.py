"""``--propose``: a branch with the winner in place, ready for review and ``cudagate approve``.

The commit is built with git plumbing on a private index (``read-tree``, ``update-index``,
``write-tree``, ``commit-tree``, ``branch``), so the working tree, the index and the checked-out
branch are never touched. It replaces the kernel's source file with ``best.cu``; when the
winner's launch differs from the suite's, the kernel's ``launch`` (and ``launch_overrides``) in
the suite file are rewritten in place (comments and layout elsewhere kept), and a per-class
winner's variants are written as the kernel's ``classes:``. A launch, a variant's included, is
signed, so the message then says the suite needs ``cudagate sign`` after review.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import yaml

from pytest_cudagate.errors import CudagateError
from pytest_cudagate.host.paths import command


def clean_tree_problem(path: Path) -> str | None:
    """Why ``--propose`` cannot run here (None: a clean git tree)."""
    try:
        import git

        repo = git.Repo(path, search_parent_directories=True, expand_vars=False)
        repo.head.commit  # noqa: B018 - raises without a commit
    except Exception as exc:
        return f"--propose needs a git repository with a commit ({exc.__class__.__name__}: {exc})"
    if repo.is_dirty(untracked_files=False):
        return "--propose needs a clean git tree: commit or stash your changes first (tracked files differ from HEAD)"
    return None


def _flow(launch: dict) -> str:
    items = [f"grid: {json.dumps([str(g) for g in launch['grid']])}", f"block: {json.dumps([str(b) for b in launch['block']])}"]
    if str(launch.get("shared_bytes", "0")) != "0":
        items.append(f"shared_bytes: {json.dumps(str(launch['shared_bytes']))}")
    return "{" + ", ".join(items) + "}"


def _kernel_node(text: str, kernel: str):
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    kernels = next((v for k, v in root.value if k.value == "kernels"), None)
    for node in kernels.value if kernels is not None else []:
        names = {k.value: v for k, v in node.value}
        if "name" in names and names["name"].value == kernel:
            return node
    raise CudagateError(f"kernel {kernel!r} not found in the suite file")


def _span(text: str, key, value) -> tuple[int, int, str]:
    """Where ``value`` stands in ``text``, and the prefix its replacement needs: a flow node is
    replaced in place; a block node from just after ``key:`` to its last character."""
    if value.flow_style:
        return value.start_mark.index, value.end_mark.index, ""
    start = text.index(":", key.end_mark.index) + 1
    end = value.end_mark.index
    while end > start and text[end - 1] in " \t\r\n":
        end -= 1
    return start, end, " "


def rewrite_launch(text: str, kernel: str, launch: dict, overrides: dict[str, dict]) -> str:
    """The suite text with ``kernel``'s launch (and overrides) replaced; the rest byte for byte."""
    node = _kernel_node(text, kernel)
    pairs = {k.value: (k, v) for k, v in node.value}
    edits = []  # (start, end, replacement), applied back to front
    key, value = pairs["launch"]
    start, end, prefix = _span(text, key, value)
    edits.append((start, end, prefix + _flow(launch)))
    if "launch_overrides" in pairs:
        ov_key, ov = pairs["launch_overrides"]
        body = ", ".join(f"{name}: {_flow(l)}" for name, l in sorted(overrides.items()))
        start, end, prefix = _span(text, ov_key, ov)
        edits.append((start, end, prefix + "{" + body + "}"))
    elif overrides:
        indent = " " * key.start_mark.column
        body = ", ".join(f"{name}: {_flow(l)}" for name, l in sorted(overrides.items()))
        after = _span(text, key, value)[1]
        line_end = text.find("\n", after)
        line_end = len(text) if line_end < 0 else line_end
        edits.append((line_end, line_end, f"\n{indent}launch_overrides: {{{body}}}"))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    yaml.safe_load(text)  # still YAML
    return text


def _variant_flow(variant: dict) -> str:
    items = [f"options: {json.dumps(list(variant['options']))}"]
    if variant.get("launch"):
        items.append(f"launch: {_flow(variant['launch'])}")
    return "{" + ", ".join(items) + "}"


def rewrite_classes(text: str, kernel: str, classes: dict[str, dict]) -> str:
    """The suite text with ``kernel``'s ``classes:`` (per-class variants) replaced, added after its
    launch (and launch_overrides), or removed when ``classes`` is empty; the rest byte for byte."""
    node = _kernel_node(text, kernel)
    pairs = {k.value: (k, v) for k, v in node.value}
    key, value = pairs["launch"]
    indent = " " * key.start_mark.column
    body = "".join(f"\n{indent}  {name}: {_variant_flow(v)}" for name, v in sorted(classes.items()))
    if "classes" in pairs:
        cl_key, cl = pairs["classes"]
        start, end = text.index(":", cl_key.end_mark.index) + 1, cl.end_mark.index
        while end > start and text[end - 1] in " \t\r\n":
            end -= 1
        if classes:
            text = text[:start] + body + text[end:]
        else:  # the whole `classes:` entry, its line included
            line_start = text.rfind("\n", 0, cl_key.start_mark.index)
            text = text[:line_start] + text[end:]
    elif classes:
        last = pairs.get("launch_overrides", (key, value))
        after = _span(text, *last)[1]
        line_end = text.find("\n", after)
        line_end = len(text) if line_end < 0 else line_end
        text = text[:line_end] + f"\n{indent}classes:{body}" + text[line_end:]
    try:
        yaml.safe_load(text)  # still YAML
    except yaml.YAMLError:
        raise CudagateError(f"--propose cannot add `classes:` to kernel {kernel}, whose entry is written in flow style "
                            "({...}): write that kernel's entry in block style (one key per line) and run again; "
                            "the winner stays in the audit pack") from None
    return text


def commit_message(summary: dict, suite_display: str, kernel: str, pack: str, launch_changed: bool) -> str:
    best = summary["best"]
    lines = [f"cudagate optimize: {summary['suite_name']}/{kernel} {best['speedup_vs_initial']:.2f}x faster ({pack})", "",
             f"Replaces the source of {kernel} with the winner of `cudagate optimize` {summary['run']}",
             f"(attempt {best['attempt']}, {best['origin']}: {best['label']}).", "",
             "Gate against the approved kernel, every case (holdout included): passed"]
    for case in best["cases"]:
        gate = case.get("gate") or {}
        ratio = gate.get("ratio_vs_approved") or {}
        shown = (f"ratio {ratio['ratio']:.3f} [{ratio.get('low') or 0:.3f}, {ratio.get('high') or 0:.3f}] "
                 if ratio.get("ratio") else "")
        lines.append(f"  {case['case']}{' (holdout)' if case['holdout'] else ''}: {shown}{gate.get('latency_verdict') or 'correct'}")
    usage = summary["usage"]
    cost = usage.get("estimated_cost_usd")
    lines += ["", f"Search: {summary['rounds']} round(s), {summary['attempts']} attempt(s) ({summary['passed_attempts']} "
                  f"passed, {summary['rejected_attempts']} rejected); stop reason: {summary['stop_reason']}",
              f"Model: {usage['model_calls']} call(s), {usage['total_tokens']} tokens, "
              + (f"${cost:.4f}" if cost is not None else "cost unknown") +
              f"; GPU {usage['gpu_seconds']:.1f} s; wall {usage['wall_seconds']:.1f} s",
              f"Audit pack: {pack} (summary.json, history.json, report.html)", ""]
    for name, variant in (best.get("classes") or {}).items():
        lines.append(f"Class {name} runs a variant: options {' '.join(variant['options'])}"
                     + (f", launch grid {variant['launch']['grid']} block {variant['launch']['block']}"
                        if variant.get("launch") else ", the shared launch") + ".")
    if launch_changed:
        lines.append(f"The launch configuration changed: it is signed, so after review a maintainer runs "
                     f"`{command('cudagate', 'sign', suite_display)}`.")
    lines.append(f"Next: review, then `{command('cudagate', 'approve', suite_display, kernel)}` on the GPU runner.")
    return "\n".join(lines) + "\n"


def propose_branch(suite, program, winner, summary: dict, pack_dir: Path, *, branch: str | None = None) -> dict:
    import git

    repo = git.Repo(suite.root, search_parent_directories=True, expand_vars=False)
    root = Path(repo.working_tree_dir).resolve()
    source_rel = program.source.resolve().relative_to(root).as_posix()
    suite_rel = suite.path.resolve().relative_to(root).as_posix()
    head = repo.head.commit.hexsha
    files = {source_rel: winner.candidate.text}
    current = {"launch": program.launch.to_json(),
               "launch_overrides": {k: v.to_json() for k, v in program.launch_overrides.items()},
               "classes": {k: v.to_json() for k, v in program.classes.items()}}
    wanted = {"classes": {}, **winner.candidate.launch_json()}
    current, wanted = json.loads(json.dumps(current)), json.loads(json.dumps(wanted))
    signed = ({k: current[k] for k in ("launch", "launch_overrides")},
              {name: v.get("launch") for name, v in current["classes"].items()})
    launch_changed = signed != ({k: wanted[k] for k in ("launch", "launch_overrides")},
                                {name: v.get("launch") for name, v in wanted["classes"].items()})
    if current != wanted:
        text = repo.git.show(f"HEAD:{suite_rel}")
        text += "\n" if not text.endswith("\n") else ""
        if current["launch"] != wanted["launch"] or current["launch_overrides"] != wanted["launch_overrides"]:
            text = rewrite_launch(text, program.name, wanted["launch"], wanted["launch_overrides"])
        if current["classes"] != wanted["classes"]:
            text = rewrite_classes(text, program.name, wanted["classes"])
        files[suite_rel] = text
    try:
        pack_display = pack_dir.resolve().relative_to(root).as_posix()
    except ValueError:
        pack_display = str(pack_dir)
    message = commit_message(summary, suite_rel, program.name, pack_display, launch_changed)
    name = branch or f"cudagate/optimize-{summary['suite_name']}-{program.name}-{summary['run']}"
    if name in [h.name for h in repo.heads]:
        raise CudagateError(f"branch {name!r} already exists; pass --branch NAME")
    env = {"GIT_INDEX_FILE": ""}
    with tempfile.TemporaryDirectory(prefix="cudagate-propose-") as work:
        env["GIT_INDEX_FILE"] = str(Path(work) / "index")
        repo.git.read_tree("HEAD", env=env)
        for rel, text in files.items():
            blob_file = Path(work) / "blob"
            blob_file.write_bytes(text.encode("utf-8"))
            blob = repo.git.hash_object("-w", str(blob_file))
            mode = (repo.git.ls_files("-s", "--", rel).split(" ") or ["100644"])[0] or "100644"
            repo.git.update_index("--add", "--cacheinfo", f"{mode},{blob},{rel}", env=env)
        tree = repo.git.write_tree(env=env)
        identity = {}
        reader = repo.config_reader()
        if not reader.has_option("user", "name"):
            identity.update(GIT_AUTHOR_NAME="cudagate optimize", GIT_COMMITTER_NAME="cudagate optimize")
        if not reader.has_option("user", "email"):
            identity.update(GIT_AUTHOR_EMAIL="cudagate@localhost", GIT_COMMITTER_EMAIL="cudagate@localhost")
        message_file = Path(work) / "message"
        message_file.write_text(message, encoding="utf-8")
        commit = repo.git.commit_tree(tree, "-p", head, "-F", str(message_file), env={**os.environ, **identity})
    repo.git.branch(name, commit)
    return {"branch": name, "commit": commit, "base": head, "files": sorted(files), "launch_changed": launch_changed,
            "message": message}
