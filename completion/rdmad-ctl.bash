# bash completion for rdmad-ctl: commands, options, and for `history` the objects of
# the running daemon. Install as /usr/share/bash-completion/completions/rdmad-ctl.
#
# Object names ("sriov pci=0000:3b:00.0", "rxe rxe0") are completed as two words,
# which `history` joins, so no quoting is needed. They come from one
# `rdmad-ctl status --json` (1 s timeout), asked only when an object is completed.
# The current word is read from COMP_LINE, not COMP_WORDS, so '=' and ':' in a PF
# reference stay part of it (readline still replaces only the text after them).

_rdmad_ctl_objects() {
    local sock=$1
    rdmad-ctl ${sock:+--socket "$sock"} --timeout 1 status --json 2>/dev/null |
        sed -n 's/^ *"obj": "\(.*\)",$/\1/p'
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
    local commands="status plan history watch reload reconcile snapshot config doctor guard pause resume"
    local common="--json --socket --timeout --state-dir --config --help"
    COMPREPLY=()

    case $prev in
    --socket | -o | --output) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
    --state-dir | --root) mapfile -t COMPREPLY < <(compgen -d -- "$cur"); return ;;
    --config) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
    --since) mapfile -t COMPREPLY < <(compgen -W "10m 1h 6h 1d 7d" -- "$cur"); return ;;
    --timeout | --wait | --limit | --for | --reason) return ;;
    esac

    local cmd="" sock="" i
    local -a args=()
    for ((i = 1; i < ${#words[@]}; i++)); do
        case ${words[i]} in
        --socket) sock=${words[i + 1]}; ((i++)) ;;
        --socket=*) sock=${words[i]#--socket=} ;;
        --timeout | --state-dir | --since | --limit | --wait | -o | --output | --root | --config | --for | --reason) ((i++)) ;;
        -*) ;;
        *) if [[ -z $cmd ]]; then cmd=${words[i]}; else args+=("${words[i]}"); fi ;;
        esac
    done

    if [[ -z $cmd ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$commands $common --version" -- "$cur")
        return
    fi
    local opts=""
    case $cmd in
    status) opts="-v --verbose" ;;
    history) opts="--since --limit" ;;
    reload | reconcile) opts="--wait" ;;
    snapshot) opts="-o --output" ;;
    guard) opts="--force" ;;
    pause) opts="--for --reason" ;;
    doctor) opts="--root" ;;
    esac
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$opts $common" -- "$cur")
        return
    fi
    if [[ $cmd == guard ]]; then
        if ((${#args[@]} == 0)); then
            mapfile -t COMPREPLY < <(compgen -W "check" -- "$cur")
        elif ((${#args[@]} == 1)); then  # the PCI drivers bound now
            mapfile -t COMPREPLY < <(compgen -W "$(ls /sys/bus/pci/drivers 2>/dev/null)" -- "$cur")
        fi
        return
    fi
    if [[ $cmd == history && ${#args[@]} -lt 2 ]]; then
        local names
        names=$(_rdmad_ctl_objects "$sock")
        if ((${#args[@]} == 0)); then
            names=$(cut -d' ' -f1 <<<"$names" | sort -u)
        else
            names=$(sed -n "s/^${args[0]} //p" <<<"$names")
        fi
        mapfile -t COMPREPLY < <(compgen -W "$names" -- "$cur")
        # readline replaces only what follows the last '=' or ':' of the word.
        local done=${cur%"${cur##*[=:]}"}
        if [[ -n $done ]]; then
            COMPREPLY=("${COMPREPLY[@]#"$done"}")
        fi
    fi
}

complete -F _rdmad_ctl rdmad-ctl
