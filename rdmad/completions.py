"""Shell completions for rdmad and rdmad-ctl (bash, zsh, fish), made from their parsers.

    python -m rdmad.completions            # write completion/*
    python -m rdmad.completions --check    # exit 1 when a file is not what the parsers make

Each script is made from the same ``argparse`` parsers the commands run and the man pages
are made from (``rdmad.cli.parser``, ``rdmad.ctl.args.parser``): sub-commands with their
one-line help, every visible option, what an option's value is (a file, a directory, one
of its choices) and each positional. The little that a parser cannot say is written here
once for the three shells: ``--since`` suggestions, the daemon's object names for
``rdmad-ctl history`` (one ``rdmad-ctl status --json``, asked only then) and the PCI
drivers for ``rdmad-ctl guard check``. The files are checked in under completion/ and
installed by the packages where each shell looks; a test keeps them equal to this
module's output.

A tool for the build and the tests: nothing in the daemon imports it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

COMMAND = "python -m rdmad.completions"
OUT = Path(__file__).resolve().parents[1] / "completion"

# What an option's value is, by its dest; a dest not named takes a value nothing completes.
FILE_DESTS = frozenset({"config", "socket", "output", "state"})
DIR_DESTS = frozenset({"root", "state_dir", "guard_kit"})
SUGGESTED = {"since": ("10m", "1h", "6h", "1d", "7d")}
# Positionals whose values come from the node, by dest.
NODE_VALUES = {"object": "objects", "target": "drivers"}


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    help: str
    kind: str | None  # None: a flag; "file", "dir", "words", "none": what its value is
    words: tuple[str, ...] = ()
    meta: str = ""  # the value's name in --help


@dataclass(frozen=True)
class Positional:
    name: str
    kind: str  # "words", "objects", "drivers", "none"
    words: tuple[str, ...] = ()
    many: bool = False


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    positionals: tuple[Positional, ...]


@dataclass(frozen=True)
class Program:
    prog: str
    options: tuple[Option, ...]
    commands: tuple[Command, ...]

    @property
    def func(self) -> str:
        return "_" + self.prog.replace("-", "_")

    def value_flags(self) -> dict[str, Option]:
        """Every option that takes a value, by each of its spellings (one kind each)."""
        out: dict[str, Option] = {}
        for opt in self.options + tuple(o for c in self.commands for o in c.options):
            if opt.kind is None:
                continue
            for flag in opt.flags:
                seen = out.setdefault(flag, opt)
                if (seen.kind, seen.words) != (opt.kind, opt.words):
                    raise ValueError(f"{self.prog} {flag}: two kinds of value")
        return out


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _option(action: argparse.Action) -> Option:
    if action.nargs == 0:
        return Option(tuple(action.option_strings), _one_line(action.help), None)
    flags, text = tuple(action.option_strings), _one_line(action.help)
    meta = str(action.metavar or action.dest.upper())
    if action.choices:
        return Option(flags, text, "words", tuple(str(c) for c in action.choices), meta)
    dest = action.dest
    kind = "file" if dest in FILE_DESTS else "dir" if dest in DIR_DESTS else "none"
    if dest in SUGGESTED:
        kind = "words"
    return Option(flags, text, kind, SUGGESTED.get(dest, ()), meta)


def _positional(action: argparse.Action) -> Positional:
    many = action.nargs in ("*", "+")
    name = str(action.metavar or action.dest)
    if action.choices:
        return Positional(name, "words", tuple(str(c) for c in action.choices), many)
    return Positional(name, NODE_VALUES.get(action.dest, "none"), (), many)


def _visible(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS


def program(parser: argparse.ArgumentParser) -> Program:
    """What a completion needs of a parser: its options, sub-commands, positionals."""
    options: list[Option] = []
    commands: list[Command] = []
    for action in parser._actions:  # argparse has no public walk; argparse-manpage reads these
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: _one_line(a.help) for a in action._choices_actions}
            for name, sub in action.choices.items():
                opts = [_option(a) for a in sub._actions if a.option_strings and _visible(a)]
                pos = [_positional(a) for a in sub._actions if not a.option_strings]
                commands.append(Command(name, helps.get(name, ""), tuple(opts), tuple(pos)))
        elif action.option_strings and _visible(action):
            options.append(_option(action))
    return Program(parser.prog, tuple(options), tuple(commands))


def programs() -> list[Program]:
    from rdmad import cli
    from rdmad.ctl import args

    return [program(cli.parser()), program(args.parser())]


# --- bash ------------------------------------------------------------------------------

BASH_HEAD = """\
# bash completion for {prog}: made by `{command}` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as /usr/share/bash-completion/completions/{prog}.
#
# The current word is read from COMP_LINE, not COMP_WORDS, so '=' and ':' in a value
# (a PF reference) stay part of it; readline still replaces only the text after them.
"""

BASH_OBJECTS = """
# The daemon's objects ("sriov pci=0000:3b:00.0", "rxe rxe0") as two words, which
# `history` joins: from one `rdmad-ctl status --json` (1 s timeout), asked only here.
_rdmad_ctl_objects() {
    local sock=$1 cur=$2
    shift 2
    local names
    names=$(rdmad-ctl ${sock:+--socket "$sock"} --timeout 1 status --json 2>/dev/null |
        sed -n 's/^ *"obj": "\\(.*\\)",$/\\1/p')
    if (($# == 0)); then
        names=$(cut -d' ' -f1 <<<"$names" | sort -u)
    elif (($# == 1)); then
        names=$(sed -n "s/^$1 //p" <<<"$names")
    else
        return
    fi
    mapfile -t COMPREPLY < <(compgen -W "$names" -- "$cur")
    # readline replaces only what follows the last '=' or ':' of the word.
    local done=${cur%"${cur##*[=:]}"}
    if [[ -n $done ]]; then
        COMPREPLY=("${COMPREPLY[@]#"$done"}")
    fi
}
"""


def _bash_value(opt: Option) -> str:
    if opt.kind == "file":
        return 'mapfile -t COMPREPLY < <(compgen -f -- "$cur")'
    if opt.kind == "dir":
        return 'mapfile -t COMPREPLY < <(compgen -d -- "$cur")'
    if opt.kind == "words":
        return f'mapfile -t COMPREPLY < <(compgen -W "{" ".join(opt.words)}" -- "$cur")'
    return ":"


def _bash_positional(p: Positional, before: str) -> str:
    if p.kind == "words":
        return f'mapfile -t COMPREPLY < <(compgen -W "{" ".join(p.words)}" -- "$cur")'
    if p.kind == "drivers":  # the PCI drivers bound now
        return (
            'mapfile -t COMPREPLY < <(compgen -W "$(ls /sys/bus/pci/drivers 2>/dev/null)"'
            ' -- "$cur")'
        )
    if p.kind == "objects":
        return f'_rdmad_ctl_objects "$sock" "$cur" "${{args[@]:{before}}}"'
    return ":"


def bash(prog: Program) -> str:
    values = prog.value_flags()
    lines = [BASH_HEAD.format(prog=prog.prog, command=COMMAND)]
    if any(p.kind == "objects" for c in prog.commands for p in c.positionals):
        lines.append(BASH_OBJECTS)
    top = [f for o in prog.options for f in o.flags]
    lines += [
        "",
        f"{prog.func}() {{",
        "    local line=${COMP_LINE:0:COMP_POINT}",
        "    local -a words",
        '    read -ra words <<<"$line"',
        '    local cur=""',
        "    if [[ $line != *[[:space:]] && ${#words[@]} -gt 0 ]]; then",
        "        cur=${words[${#words[@]} - 1]}",
        "        unset 'words[${#words[@]}-1]'",
        "    fi",
        '    local prev=""',
        "    ((${#words[@]})) && prev=${words[${#words[@]} - 1]}",
        "    COMPREPLY=()",
        "",
        "    case $prev in",
    ]
    by_action: dict[str, list[str]] = {}
    for flag, opt in values.items():
        by_action.setdefault(_bash_value(opt), []).append(flag)
    for action, flags in by_action.items():
        lines.append(f"    {' | '.join(flags)}) {action}; return ;;")
    lines += [
        "    esac",
        "",
        '    local cmd="" sock="" i',
        "    local -a args=()",
        "    for ((i = 1; i < ${#words[@]}; i++)); do",
        "        case ${words[i]} in",
    ]
    if "--socket" in values:
        lines += [
            "        --socket) sock=${words[i + 1]}; ((i++)) ;;",
            "        --socket=*) sock=${words[i]#--socket=} ;;",
        ]
    others = [f for f in values if f != "--socket"]
    if others:
        lines.append(f"        {' | '.join(others)}) ((i++)) ;;")
    lines += [
        "        -*) ;;",
        '        *) if [[ -z $cmd ]]; then cmd=${words[i]}; else args+=("${words[i]}"); fi ;;',
        "        esac",
        "    done",
        "",
        "    if [[ -z $cmd ]]; then",
        f'        mapfile -t COMPREPLY < <(compgen -W "{" ".join(c.name for c in prog.commands)}'
        f' {" ".join(top)}" -- "$cur")',
        "        return",
        "    fi",
        '    local opts=""',
        "    case $cmd in",
    ]
    for c in prog.commands:
        spelled = " ".join(f for o in c.options for f in o.flags)
        lines.append(f'    {c.name}) opts="{spelled}" ;;')
    lines += [
        "    esac",
        "    if [[ $cur == -* ]]; then",
        '        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")',
        "        return",
        "    fi",
        "    case $cmd in",
    ]
    for c in prog.commands:
        if not c.positionals:
            continue
        lines.append(f"    {c.name})")
        lines.append("        case ${#args[@]} in")
        for i, p in enumerate(c.positionals):
            at = f"{i}" if not p.many else "*"
            lines.append(f"        {at}) {_bash_positional(p, str(i))} ;;")
        lines.append("        esac ;;")
    lines += ["    esac", "}", "", f"complete -F {prog.func} {prog.prog}", ""]
    return "\n".join(lines)


# --- zsh -------------------------------------------------------------------------------

ZSH_HEAD = """\
#compdef {prog}
# zsh completion for {prog}: made by `{command}` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as _{prog} in /usr/share/zsh/vendor-completions (Debian, Ubuntu) or
# /usr/share/zsh/site-functions (the RHEL family).
"""

ZSH_OBJECTS = """
# The daemon's objects as two words (`history sriov pci=...`), from one
# `rdmad-ctl status --json` (1 s timeout), asked only here.
(( $+functions[_rdmad_ctl_objects] )) || _rdmad_ctl_objects() {
  local sock=${opt_args[--socket]:-$_rdmad_ctl_socket} i
  local -a given names
  for (( i = 2; i < CURRENT; i++ )); do
    [[ $words[i] == -* || $words[i-1] == --(since|limit|socket|timeout|state-dir|config) ]] ||
      given+=($words[i])
  done
  names=(${(f)"$(rdmad-ctl ${sock:+--socket} $sock --timeout 1 status --json 2>/dev/null |
    sed -n 's/^ *"obj": "\\(.*\\)",$/\\1/p')"})
  if (( $#given == 0 )); then
    compadd -- ${(u)names%% *}
  elif (( $#given == 1 )); then
    compadd -- ${${(M)names:#$given[1] *}#$given[1] }
  fi
}
"""

ZSH_DRIVERS = """
(( $+functions[_rdmad_ctl_drivers] )) || _rdmad_ctl_drivers() {
  compadd -- /sys/bus/pci/drivers/*(N:t)
}
"""


def _zq(text: str) -> str:
    """Text inside a single-quoted _arguments spec: quotes and brackets escaped (a colon
    inside a description's brackets, or after a _describe name, is text)."""
    text = text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
    return text.replace("'", "'\\''")


def _zsh_action(kind: str | None, words: tuple[str, ...]) -> str:
    return {
        "file": "_files",
        "dir": "_files -/",
        "words": f"({' '.join(words)})",
        "objects": "_rdmad_ctl_objects",
        "drivers": "_rdmad_ctl_drivers",
    }.get(kind or "", " ")


def _zsh_options(opts: tuple[Option, ...]) -> list[str]:
    specs = []
    for o in opts:
        group = f"({' '.join(o.flags)})" if len(o.flags) > 1 else ""
        if o.flags[0] in ("-h", "--version"):
            group = "(- *)"  # nothing after --help or --version
        for flag in o.flags:
            if o.kind is None:
                specs.append(f"'{group}{flag}[{_zq(o.help)}]'")
            else:
                sep = "+" if not flag.startswith("--") else "="
                action = _zsh_action(o.kind, o.words)
                meta = _zq(o.meta).replace(":", "\\:")
                specs.append(f"'{group}{flag}{sep}[{_zq(o.help)}]:{meta}:{action}'")
    return specs


def _zsh_positionals(c: Command) -> list[str]:
    specs = []
    for i, p in enumerate(c.positionals, 1):
        action = _zsh_action(p.kind, p.words)
        at = "*" if p.many else str(i)
        name = _zq(p.name).replace(":", "\\:")
        specs.append(f"'{at}:{name}:{action}'")
    return specs


def _zsh_args(specs: list[str], indent: str) -> str:
    return f" \\\n{indent}".join(["_arguments -s -S", *specs])


def zsh(prog: Program) -> str:
    kinds = {p.kind for c in prog.commands for p in c.positionals}
    parts = [ZSH_HEAD.format(prog=prog.prog, command=COMMAND)]
    if "objects" in kinds:
        parts.append(ZSH_OBJECTS)
    if "drivers" in kinds:
        parts.append(ZSH_DRIVERS)
    described = "\n".join(f"    '{c.name}:{_zq(c.help)}'" for c in prog.commands)
    top = [*_zsh_options(prog.options), "'1:command:->command'", "'*::argument:->argument'"]
    lines = [
        "",
        f"{prog.func}() {{",
        "  local curcontext=$curcontext state state_descr line ret=1",
        "  typeset -A opt_args",
        "  "
        + _zsh_args(top, "    ").replace("_arguments -s -S", "_arguments -C -s -S")
        + " && ret=0",
        "  case $state in",
        "  command)",
        "    local -a commands=(",
        described,
        "    )",
        "    _describe -t commands command commands && ret=0 ;;",
        "  argument)",
        f"    curcontext=${{curcontext%:*:*}}:{prog.prog}-$words[1]:",
        *(
            ["    local _rdmad_ctl_socket=${opt_args[--socket]}  # given before the command"]
            if "objects" in kinds
            else []
        ),
        "    case $words[1] in",
    ]
    for c in prog.commands:
        specs = _zsh_options(c.options) + _zsh_positionals(c)
        lines.append(f"    {c.name})")
        lines.append("      " + _zsh_args(specs, "        ") + " && ret=0 ;;")
    lines += ["    esac ;;", "  esac", "  return ret", "}", "", f'{prog.func} "$@"', ""]
    parts.append("\n".join(lines))
    return "".join(parts)


# --- fish ------------------------------------------------------------------------------

FISH_HEAD = """\
# fish completion for {prog}: made by `{command}` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as /usr/share/fish/vendor_completions.d/{prog}.fish.

# The words after the sub-command that are not options or their values.
function __{func}_args
    set -l tokens (commandline -opc)
    set -l skip 0
    set -l seen 0
    for t in $tokens[2..-1]
        if test $skip = 1
            set skip 0
        else if contains -- $t {value_flags}
            set skip 1
        else if not string match -q -- '-*' $t
            if test $seen = 1
                echo $t
            end
            set seen 1
        end
    end
end

function __{func}_nargs
    test (count (__{func}_args)) -eq $argv[1]
end
"""

FISH_OBJECTS = """
# The daemon's objects as two words (`history sriov pci=...`), from one
# `rdmad-ctl status --json` (1 s timeout), asked only here.
function __rdmad_ctl_objects
    set -l given (__rdmad_ctl_args)
    set -l tokens (commandline -opc)
    set -l sock
    set -l i (contains -i -- --socket $tokens)
    and set sock --socket $tokens[(math $i + 1)]
    set -l names (rdmad-ctl $sock --timeout 1 status --json 2>/dev/null |
        string replace -rf '^ *"obj": "(.*)",$' '$1')
    switch (count $given)
        case 0
            string replace -r ' .*' '' -- $names | sort -u
        case 1
            string replace -rf "^$given[1] " '' -- $names
    end
end
"""


def _fq(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(prog: str, cond: str, o: Option) -> str:
    parts = [f"complete -c {prog}"]
    if cond:
        parts.append(f"-n {_fq(cond)}")
    for flag in o.flags:
        parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
    if o.kind == "file":
        parts.append("-r -F")
    elif o.kind == "dir":
        parts.append("-r -a '(__fish_complete_directories)'")
    elif o.kind == "words":
        parts.append(f"-x -a {_fq(' '.join(o.words))}")
    elif o.kind == "none":
        parts.append("-x")
    parts.append(f"-d {_fq(o.help)}")
    return " ".join(parts)


def _fish_positional(prog: Program, cond: str, i: int, p: Positional) -> str | None:
    if p.kind == "none":
        return None
    values = {
        "words": " ".join(p.words),
        "drivers": "(string replace -r '.*/' '' -- /sys/bus/pci/drivers/*)",
        "objects": "(__rdmad_ctl_objects)",
    }[p.kind]
    at = "" if p.many else f"; and __{prog.prog.replace('-', '_')}_nargs {i}"
    return f"complete -c {prog.prog} -n {_fq(cond + at)} -f -a {_fq(values)}"


def fish(prog: Program) -> str:
    values = " ".join(prog.value_flags())
    func = prog.prog.replace("-", "_")
    head = FISH_HEAD.format(prog=prog.prog, command=COMMAND, func=func, value_flags=values)
    lines = [head]
    if any(p.kind == "objects" for c in prog.commands for p in c.positionals):
        lines.append(FISH_OBJECTS)
    names = " ".join(c.name for c in prog.commands)
    lines += ["", f"complete -c {prog.prog} -f"]
    top = f"not __fish_seen_subcommand_from {names}"
    for o in prog.options:
        lines.append(_fish_option(prog.prog, top, o))
    for c in prog.commands:
        lines.append(f"complete -c {prog.prog} -n {_fq(top)} -a {c.name} -d {_fq(c.help)}")
    for c in prog.commands:
        cond = f"__fish_seen_subcommand_from {c.name}"
        for o in c.options:
            lines.append(_fish_option(prog.prog, cond, o))
        for i, p in enumerate(c.positionals):
            line = _fish_positional(prog, cond, i, p)
            if line:
                lines.append(line)
    return "\n".join(lines) + "\n"


# --- the files -------------------------------------------------------------------------


def files() -> dict[str, str]:
    """File name under completion/ -> its text."""
    out: dict[str, str] = {}
    for prog in programs():
        out[f"{prog.prog}.bash"] = bash(prog)
        out[f"_{prog.prog}"] = zsh(prog)
        out[f"{prog.prog}.fish"] = fish(prog)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help="the directory to write into")
    ap.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    stale = []
    for name, text in files().items():
        path = out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"written: {path}")
    if stale:
        print(f"not what the parsers make: {', '.join(stale)}; run: {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
