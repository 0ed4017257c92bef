# zsh -f capture.zsh FPATHDIR LINE: what zsh's completion offers after LINE, one a line.
# An interactive zsh on a pseudo-terminal (zpty) completes LINE with compadd wrapped to
# print each candidate it is given, marked (the marker is computed, so the echoed input
# never holds it), and a last marker when the attempt is over.
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT=; fpath=(${(q)1} \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'compadd() { typeset -a __hits; builtin compadd -A __hits "$@"; local h; for h in $__hits; do print -r -- "<<$((1+1))>>$h"; done; builtin compadd "$@"; }'
zpty -w z 'comppostfuncs=( _capture_done ); _capture_done() { print -r -- "<<$((2+1))>>"; }'
zpty -n -w z ${2}$'\t'  # no newline: the line is completed, never run
local line out
while zpty -r z line; do
    out=${line//$'\r'/}
    [[ $out == *'<<3>>'* ]] && break
    [[ $out == *"<<2>>"* ]] && print -r -- ${out##*"<<2>>"}
done
zpty -d z
