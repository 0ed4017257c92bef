# bash completion for rdmad: made by `python -m rdmad.completions` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as /usr/share/bash-completion/completions/rdmad.
#
# The current word is read from COMP_LINE, not COMP_WORDS, so '=' and ':' in a value
# (a PF reference) stay part of it; readline still replaces only the text after them.


_rdmad() {
    local line=${COMP_LINE:0:COMP_POINT}
    local -a words
    read -ra words <<<"$line"
    local cur=""
    if [[ $line != *[[:space:]] && ${#words[@]} -gt 0 ]]; then
        cur=${words[${#words[@]} - 1]}
        unset 'words[${#words[@]}-1]'
    fi
    local prev=""
    ((${#words[@]})) && prev=${words[${#words[@]} - 1]}
    COMPREPLY=()

    case $prev in
    --config | --state | -o | --output) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
    --root | --guard-kit) mapfile -t COMPREPLY < <(compgen -d -- "$cur"); return ;;
    --log-level) mapfile -t COMPREPLY < <(compgen -W "debug info warning error" -- "$cur"); return ;;
    --log-format) mapfile -t COMPREPLY < <(compgen -W "auto json logfmt console" -- "$cur"); return ;;
    esac

    local cmd="" sock="" i
    local -a args=()
    for ((i = 1; i < ${#words[@]}; i++)); do
        case ${words[i]} in
        --config | --root | --state | -o | --output | --guard-kit | --log-level | --log-format) ((i++)) ;;
        -*) ;;
        *) if [[ -z $cmd ]]; then cmd=${words[i]}; else args+=("${words[i]}"); fi ;;
        esac
    done

    if [[ -z $cmd ]]; then
        mapfile -t COMPREPLY < <(compgen -W "check-config plan snapshot run -h --help --version" -- "$cur")
        return
    fi
    local opts=""
    case $cmd in
    check-config) opts="-h --help --config --json" ;;
    plan) opts="-h --help --config --root --state --daemon --json" ;;
    snapshot) opts="-h --help --root -o --output --json" ;;
    run) opts="-h --help --config --foreground --dry-run --root --guard-kit --log-level --log-format" ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return
    fi
    case $cmd in
    esac
}

complete -F _rdmad rdmad
