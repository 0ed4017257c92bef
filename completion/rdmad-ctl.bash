# bash completion for rdmad-ctl: made by `python -m rdmad.completions` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as /usr/share/bash-completion/completions/rdmad-ctl.
#
# The current word is read from COMP_LINE, not COMP_WORDS, so '=' and ':' in a value
# (a PF reference) stay part of it; readline still replaces only the text after them.


# The daemon's objects ("sriov pci=0000:3b:00.0", "rxe rxe0") as two words, which
# `history` joins: from one `rdmad-ctl status --json` (1 s timeout), asked only here.
_rdmad_ctl_objects() {
    local sock=$1 cur=$2
    shift 2
    local names
    names=$(rdmad-ctl ${sock:+--socket "$sock"} --timeout 1 status --json 2>/dev/null |
        sed -n 's/^ *"obj": "\(.*\)",$/\1/p')
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


_rdmad_ctl() {
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
    --socket | --config | -o | --output) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
    --timeout | --limit | --within | --wait | --for | --reason) :; return ;;
    --state-dir | --root) mapfile -t COMPREPLY < <(compgen -d -- "$cur"); return ;;
    --since) mapfile -t COMPREPLY < <(compgen -W "10m 1h 6h 1d 7d" -- "$cur"); return ;;
    esac

    local cmd="" sock="" i
    local -a args=()
    for ((i = 1; i < ${#words[@]}; i++)); do
        case ${words[i]} in
        --socket) sock=${words[i + 1]}; ((i++)) ;;
        --socket=*) sock=${words[i]#--socket=} ;;
        --timeout | --state-dir | --config | --since | --limit | --within | --wait | -o | --output | --for | --reason | --root) ((i++)) ;;
        -*) ;;
        *) if [[ -z $cmd ]]; then cmd=${words[i]}; else args+=("${words[i]}"); fi ;;
        esac
    done

    if [[ -z $cmd ]]; then
        mapfile -t COMPREPLY < <(compgen -W "status plan history watch wait reload reconcile snapshot config guard pause resume doctor -h --help --version --json --socket --timeout --state-dir --config" -- "$cur")
        return
    fi
    local opts=""
    case $cmd in
    status) opts="-h --help --json --socket --timeout --state-dir --config -v --verbose" ;;
    plan) opts="-h --help --json --socket --timeout --state-dir --config" ;;
    history) opts="-h --help --json --socket --timeout --state-dir --config --since --limit" ;;
    watch) opts="-h --help --json --socket --timeout --state-dir --config" ;;
    wait) opts="-h --help --json --socket --timeout --state-dir --config --within" ;;
    reload) opts="-h --help --json --socket --timeout --state-dir --config --wait" ;;
    reconcile) opts="-h --help --json --socket --timeout --state-dir --config --wait" ;;
    snapshot) opts="-h --help --json --socket --timeout --state-dir --config -o --output" ;;
    config) opts="-h --help --json --socket --timeout --state-dir --config" ;;
    guard) opts="-h --help --json --socket --timeout --state-dir --config --force" ;;
    pause) opts="-h --help --json --socket --timeout --state-dir --config --for --reason" ;;
    resume) opts="-h --help --json --socket --timeout --state-dir --config" ;;
    doctor) opts="-h --help --json --socket --timeout --state-dir --config --root" ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")
        return
    fi
    case $cmd in
    history)
        case ${#args[@]} in
        *) _rdmad_ctl_objects "$sock" "$cur" "${args[@]:0}" ;;
        esac ;;
    guard)
        case ${#args[@]} in
        0) mapfile -t COMPREPLY < <(compgen -W "check" -- "$cur") ;;
        1) mapfile -t COMPREPLY < <(compgen -W "$(ls /sys/bus/pci/drivers 2>/dev/null)" -- "$cur") ;;
        esac ;;
    esac
}

complete -F _rdmad_ctl rdmad-ctl
