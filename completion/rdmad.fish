# fish completion for rdmad: made by `python -m rdmad.completions` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as /usr/share/fish/vendor_completions.d/rdmad.fish.

# The words after the sub-command that are not options or their values.
function __rdmad_args
    set -l tokens (commandline -opc)
    set -l skip 0
    set -l seen 0
    for t in $tokens[2..-1]
        if test $skip = 1
            set skip 0
        else if contains -- $t --config --root --state -o --output --guard-kit --log-level --log-format
            set skip 1
        else if not string match -q -- '-*' $t
            if test $seen = 1
                echo $t
            end
            set seen 1
        end
    end
end

function __rdmad_nargs
    test (count (__rdmad_args)) -eq $argv[1]
end


complete -c rdmad -f
complete -c rdmad -n 'not __fish_seen_subcommand_from check-config plan snapshot run' -s h -l help -d 'show this help message and exit'
complete -c rdmad -n 'not __fish_seen_subcommand_from check-config plan snapshot run' -l version -d 'show program\'s version number and exit'
complete -c rdmad -n 'not __fish_seen_subcommand_from check-config plan snapshot run' -a check-config -d 'validate the config; print every error'
complete -c rdmad -n 'not __fish_seen_subcommand_from check-config plan snapshot run' -a plan -d 'print what the config on disk would do here (--daemon: the running daemon\'s pending plan, from the config it loaded)'
complete -c rdmad -n 'not __fish_seen_subcommand_from check-config plan snapshot run' -a snapshot -d 'write the node\'s live SR-IOV and rxe state in config format (make what was set by hand persistent)'
complete -c rdmad -n 'not __fish_seen_subcommand_from check-config plan snapshot run' -a run -d 'run the daemon (in the foreground, as systemd expects)'
complete -c rdmad -n '__fish_seen_subcommand_from check-config' -s h -l help -d 'show this help message and exit'
complete -c rdmad -n '__fish_seen_subcommand_from check-config' -l config -r -F -d 'config directory (rdmad.toml + rdmad.d/*.toml) or one file (default /etc/rdmad)'
complete -c rdmad -n '__fish_seen_subcommand_from check-config' -l json -d 'machine-readable output'
complete -c rdmad -n '__fish_seen_subcommand_from plan' -s h -l help -d 'show this help message and exit'
complete -c rdmad -n '__fish_seen_subcommand_from plan' -l config -r -F -d 'config directory (rdmad.toml + rdmad.d/*.toml) or one file (default /etc/rdmad)'
complete -c rdmad -n '__fish_seen_subcommand_from plan' -l root -r -a '(__fish_complete_directories)' -d 'observe the sysfs/procfs tree under this directory instead of the host (computed here, not asked of the daemon)'
complete -c rdmad -n '__fish_seen_subcommand_from plan' -l state -r -F -d 'the daemon\'s state file, for which rxe links it created (default: state.json in [daemon] state_dir)'
complete -c rdmad -n '__fish_seen_subcommand_from plan' -l daemon -d 'print the running daemon\'s pending plan, from the config it loaded (its socket: $RDMAD_SOCKET or [api] socket); as `rdmad-ctl plan`'
complete -c rdmad -n '__fish_seen_subcommand_from plan' -l json -d 'machine-readable output'
complete -c rdmad -n '__fish_seen_subcommand_from snapshot' -s h -l help -d 'show this help message and exit'
complete -c rdmad -n '__fish_seen_subcommand_from snapshot' -l root -r -a '(__fish_complete_directories)' -d 'observe the sysfs/procfs tree under this directory instead of the host'
complete -c rdmad -n '__fish_seen_subcommand_from snapshot' -s o -l output -r -F -d 'write to this file (atomically)'
complete -c rdmad -n '__fish_seen_subcommand_from snapshot' -l json -d 'print {\'toml\': ..., \'notes\': [...]} instead'
complete -c rdmad -n '__fish_seen_subcommand_from run' -s h -l help -d 'show this help message and exit'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l config -r -F -d 'config directory (rdmad.toml + rdmad.d/*.toml) or one file (default /etc/rdmad)'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l foreground -d 'accepted; always the case'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l dry-run -d 'log the actions, change nothing'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l root -r -a '(__fish_complete_directories)' -d 'with --dry-run: observe the sysfs/procfs tree under this directory instead of the host (a what-if run against a copied or made-up node)'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l guard-kit -r -a '(__fish_complete_directories)' -d 'rdmad runs in a container and the host has not its package: copy the driver guard to DIR, a host directory mounted at the same path, for the host\'s modprobe.d hook to run with the host\'s python3; the hook is removed when rdmad stops'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l log-level -x -a 'debug info warning error' -d 'the least level logged (default: [daemon] log_level of the config, info)'
complete -c rdmad -n '__fish_seen_subcommand_from run' -l log-format -x -a 'auto json logfmt console' -d 'default: [daemon] log_format of the config; auto is console on a terminal, logfmt otherwise (the journal)'
