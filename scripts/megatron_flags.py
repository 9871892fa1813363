#!/usr/bin/env python3
"""Megatron-LM's flag sets against this build (tests/train/megatron_flags/README.md has the file format).

  megatron_flags.py doc          --pretrain-gpt BIN [--out docs/flags.md]   write the flag table
  megatron_flags.py check-doc    --pretrain-gpt BIN --convert-checkpoint BIN [--preprocess-data BIN]
                                 fail when docs/flags.md differs from the table the binaries give, or a flag of
                                 the sources is unknown to the tool it belongs to
  megatron_flags.py run-examples --pretrain-gpt BIN [--only NAME]
                                 run each example's flag set, shrunk to a tiny CPU model: it trains, or it fails
                                 naming every refused flag with its reason and then trains without them

Standard library only; the temporary directories it makes are removed.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAG_DIR = os.path.join(ROOT, "tests", "train", "megatron_flags")
DOC = os.path.join(ROOT, "docs", "flags.md")
# Column names of the sources in the table, by file.
SOURCES = [("gpt3_175b", "gpt3"), ("gpt3_175b_rampup", "gpt3 (ramp-up)"), ("llama3_8b_fp8", "llama3"),
           ("mixtral_8x7b", "mixtral"), ("moe_guide_mixtral", "moe guide"), ("guides", "guides")]


def read_flag_file(path):
    """{'flags': [[flag, values...]], 'tiny': [...], 'expect': [...], 'trainable': [...], 'tools': {flag: tool}}"""
    out = {"flags": [], "tiny": [], "expect": [], "consumed": [], "prints": [], "trainable": [], "tools": {}}
    section = "flags"
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            if section == "expect":
                kind, text = (s.strip() for s in line.split(":", 1))
                out[kind if kind in ("consumed", "prints") else "expect"].append(text)
                continue
            words = shlex.split(line)
            if os.path.basename(path) == "guides.flags":
                out["tools"][words[0]] = words[1]
                out["flags"].append([words[0]])
                continue
            out[section].append(words)
    return out


def apply_edits(flags, edits):
    flags = [list(f) for f in flags]
    for edit in edits:
        if edit[0].startswith("!"):
            flags = [f for f in flags if f[0] != edit[0][1:]]
            continue
        for f in flags:
            if f[0] == edit[0]:
                f[1:] = edit[1:]
                break
        else:
            flags.append(list(edit))
    return flags


def list_flags(pretrain_gpt):
    """{flag: (status, reason)} from pretrain_gpt --list-flags."""
    text = subprocess.run([pretrain_gpt, "--list-flags"], check=True, capture_output=True, text=True).stdout
    table = {}
    for line in text.splitlines():
        name, status, reason = (line.split("\t") + ["", ""])[:3]
        table[name] = (status, reason)
    return table


def source_flags():
    """[(flag, [source columns], tool)] over every source file, in first-seen order per source."""
    rows = {}
    for stem, column in SOURCES:
        data = read_flag_file(os.path.join(FLAG_DIR, stem + ".flags"))
        for words in data["flags"]:
            flag = words[0]
            row = rows.setdefault(flag, {"sources": [], "tool": data["tools"].get(flag, "pretrain_gpt")})
            if column not in row["sources"]:
                row["sources"].append(column)
    return sorted(rows.items())


def tool_help(binary):
    if not binary:
        return None
    proc = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def make_table(statuses, helps):
    """The markdown of docs/flags.md and a list of problems (flags a tool does not know)."""
    problems, lines, counts = [], [], {}
    for flag, row in source_flags():
        tool = row["tool"]
        if tool == "pretrain_gpt":
            status, reason = statuses.get(flag, ("unknown", ""))
            if status == "unknown":
                problems.append(f"{flag}: in the sources but pretrain_gpt does not know it")
        elif tool == "torchrun":
            status, reason = "launcher", "torchrun's own option (torchrun --no-python ... pretrain_gpt)"
        else:
            status, reason = "supported", f"a {tool} flag (docs: `{tool} --help`)"
            text = helps.get(tool)
            if text is not None and not re.search(re.escape(flag) + r"\b", text):
                problems.append(f"{flag}: in the sources as a {tool} flag but `{tool} --help` does not list it")
        counts[(tool, status)] = counts.get((tool, status), 0) + 1
        reason = reason.replace("|", "\\|")
        lines.append(f"| `{flag}` | {', '.join(row['sources'])} | {tool} | {status} | {reason} |")
    summary = [f"- {tool}: " + ", ".join(f"{n} {status}" for (t, status), n in sorted(counts.items()) if t == tool)
               for tool in sorted({t for t, _ in counts})]
    head = [
        "# Megatron-LM's flags here",
        "",
        "Generated by `scripts/megatron_flags.py doc` from the flag sets in tests/train/megatron_flags/ (Megatron-LM's",
        "examples/gpt3, examples/llama and examples/mixtral launch scripts, the MoE guide's script, and the guides'",
        "list in MEGATRON-COMPAT.md) and `pretrain_gpt --list-flags`; CI (`megatron_flags_doc`) fails when they",
        "disagree. Do not edit by hand.",
        "",
        "Status: **supported** (Megatron's meaning), **no-op** (accepted and checked, changes nothing here: the",
        "reason says why), **refused** (pretrain_gpt stops before any work, naming the flag with the reason and what",
        "to use instead). A run with a refused flag reports every problem at once. `pretrain_gpt --help` lists",
        "every flag pretrain_gpt knows, including those of no source here.",
        "",
    ] + summary + ["", "| flag | sources | tool | status | meaning here / reason |", "|---|---|---|---|---|"]
    return "\n".join(head + lines) + "\n", problems


def cmd_doc(args, check):
    helps = {"convert_checkpoint": tool_help(args.convert_checkpoint), "preprocess_data": tool_help(args.preprocess_data)}
    text, problems = make_table(list_flags(args.pretrain_gpt), helps)
    if not check:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        with open(args.out) as f:
            if f.read() != text:
                problems.append(f"{args.out} is not what the binaries give: run scripts/megatron_flags.py doc "
                                "--pretrain-gpt build/tools/pretrain_gpt and commit it")
    for p in problems:
        print("FAIL:", p)
    print(f"{0 if problems else 1} passed, {1 if problems else 0} failed")
    return 1 if problems else 0


def substitute(flags, tmp):
    paths = {"$CHECKPOINT_PATH": os.path.join(tmp, "checkpoints"), "$TENSORBOARD_LOGS_PATH": os.path.join(tmp, "tb"),
             "$DATA_CACHE_PATH": os.path.join(tmp, "cache"), "$DATA_PATH": os.path.join(tmp, "data"),
             "$VOCAB_FILE": os.path.join(tmp, "vocab.json"), "$MERGE_FILE": os.path.join(tmp, "merges.txt"),
             "$TOKENIZER_MODEL": os.path.join(tmp, "tokenizer.model")}
    out = []
    for words in flags:
        for w in words:
            for k, v in paths.items():
                w = w.replace(k, v)
            out.append(w)
    return out


def run(pretrain_gpt, argv):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run([pretrain_gpt] + argv, capture_output=True, text=True, env=env, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def trained(output):
    its = re.findall(r"iteration\s+(\d+)/\s*(\d+) \|", output)
    return bool(its) and its[-1][0] == its[-1][1] and "lm loss:" in output


def run_example(pretrain_gpt, stem, statuses):
    data = read_flag_file(os.path.join(FLAG_DIR, stem + ".flags"))
    flags = apply_edits(data["flags"], data["tiny"])
    refused = [f[0] for f in flags if statuses.get(f[0], ("?",))[0] == "refused"]
    failures = []
    with tempfile.TemporaryDirectory(prefix=f"megatron_flags_{stem}_") as tmp:
        rc, out = run(pretrain_gpt, substitute(flags, tmp))
        if refused or data["expect"]:
            if rc == 0:
                failures.append("the run as written trained, but it has refused flags or breaks a rule")
            for flag in refused:
                reason = statuses[flag][1]
                if not re.search(re.escape(flag) + r"[ :]", out) or reason not in out:
                    failures.append(f"the run's error does not name {flag} with its reason '{reason}'")
            for text in data["expect"]:
                if text not in out:
                    failures.append(f"the run's error does not say '{text}'")
        elif rc != 0 or not trained(out):
            failures.append("the run as written did not train")
        if failures:
            print(out[-4000:])
        trainable = apply_edits([f for f in flags if f[0] not in refused], data["trainable"])
        rc2, out2 = run(pretrain_gpt, substitute(trainable, tmp))
        if rc2 != 0 or not trained(out2):
            failures.append(f"without the refused flags ({' '.join(refused) or 'none'}) it did not train:\n{out2[-4000:]}")
        consumed = " ".join(re.findall(r"consumed samples:\s+(\d+) \|", out2))
        for expected in data["consumed"]:  # the batch-size schedule, iteration by iteration
            if consumed != expected:
                failures.append(f"consumed samples per iteration {consumed}, expected {expected}")
        for text in data["prints"]:
            if text not in out2:
                failures.append(f"the training run did not print '{text}'")
    status = "FAIL" if failures else "ok"
    print(f"[{status}] {stem}: refused {' '.join(refused) or 'none'}; " +
          ("trained without them" if not failures else "; ".join(failures)))
    return not failures


def cmd_run_examples(args):
    statuses = list_flags(args.pretrain_gpt)
    stems = [s for s, _ in SOURCES if s != "guides" and (not args.only or s == args.only)]
    passed = sum(run_example(args.pretrain_gpt, s, statuses) for s in stems)
    print(f"{passed} passed, {len(stems) - passed} failed")
    return 0 if passed == len(stems) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["doc", "check-doc", "run-examples"])
    p.add_argument("--pretrain-gpt", required=True)
    p.add_argument("--convert-checkpoint")
    p.add_argument("--preprocess-data")
    p.add_argument("--out", default=DOC)
    p.add_argument("--only")
    args = p.parse_args()
    if args.command == "run-examples":
        return cmd_run_examples(args)
    return cmd_doc(args, check=args.command == "check-doc")


if __name__ == "__main__":
    sys.exit(main())
