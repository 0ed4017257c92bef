# fish completion for rdmad-ctl: made by `python -m rdmad.completions` from its argument parser;
# do not edit, change the parser (or rdmad/completions.py) and run it again.
# Installed as /usr/share/fish/vendor_completions.d/rdmad-ctl.fish.

# The words after the sub-command that are not options or their values.
function __rdmad_ctl_args
    set -l tokens (commandline -opc)
    set -l skip 0
    set -l seen 0
    for t in $tokens[2..-1]
        if test $skip = 1
            set skip 0
        else if contains -- $t --socket --timeout --state-dir --config --since --limit --within --wait -o --output --for --reason --root
            set skip 1
        else if not string match -q -- '-*' $t
            if test $seen = 1
                echo $t
            end
            set seen 1
        end
    end
end

function __rdmad_ctl_nargs
    test (count (__rdmad_ctl_args)) -eq $argv[1]
end


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


complete -c rdmad-ctl -f
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -l version -d 'show program\'s version number and exit'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a status -d 'the node at a glance (exit 0 converged, 1 not)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a plan -d 'the daemon\'s exact next pass, without applying it'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a history -d 'changes and events, oldest first'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a watch -d 'follow changes live, one line per event (Ctrl-C stops, exit 0)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a wait -d 'wait until the node is converged (exit 0), or --within seconds (exit 1)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a reload -d 're-read the config (as SIGHUP / systemctl reload rdmad)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a reconcile -d 'run a reconcile pass now'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a snapshot -d 'the live SR-IOV and rxe state in config format'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a config -d 'the effective config, each value with the file and key it came from'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a guard -d 'may a PF driver (or rdma_rxe) be unloaded now? (exit 0 yes, 1 no)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a pause -d 'stand back: load no module and create no rxe link for a while'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a resume -d 'end a pause now (rdmad restores what the pause held back)'
complete -c rdmad-ctl -n 'not __fish_seen_subcommand_from status plan history watch wait reload reconcile snapshot config guard pause resume doctor' -a doctor -d 'what blocks RDMA / GPUDirect on this node (read-only; no daemon needed)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from status' -s v -l verbose -d 'every VF and attribute, converged or not'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from plan' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from plan' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from plan' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from plan' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from plan' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from plan' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l since -x -a '10m 1h 6h 1d 7d' -d 'only entries after'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -l limit -x -d 'the newest N (default 200)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from history' -f -a '(__rdmad_ctl_objects)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from watch' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from watch' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from watch' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from watch' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from watch' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from watch' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from wait' -l within -x -d 'give up after S seconds (default 120; 0: look once)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reload' -l wait -x -d 'wait up to S seconds for the pass that answers it (0: do not wait; at most 600; default 30)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from reconcile' -l wait -x -d 'wait up to S seconds for the pass that answers it (0: do not wait; at most 600; default 30)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from snapshot' -s o -l output -r -F -d 'write the TOML to FILE (atomically)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from config' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from config' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from config' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from config' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from config' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from config' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard' -l force -d 'allow even when in use (logged)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard; and __rdmad_ctl_nargs 0' -f -a 'check'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from guard; and __rdmad_ctl_nargs 1' -f -a '(string replace -r \'.*/\' \'\' -- /sys/bus/pci/drivers/*)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l for -x -d 'at most S seconds (1..3600, default 600)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from pause' -l reason -x -d 'shown in status'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from resume' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from resume' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from resume' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from resume' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from resume' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from resume' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -s h -l help -d 'show this help message and exit'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -l json -d 'the API\'s JSON'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -l socket -r -F -d 'the API socket (default $RDMAD_SOCKET, else [api] socket of the config, else /run/rdmad/rdmad.sock)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -l timeout -x -d 'seconds to wait for an answer, room in a busy socket\'s queue included (default 5)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -l state-dir -r -a '(__fish_complete_directories)' -d 'where the daemon saves its state, read when it is down (default [daemon] state_dir of the config, else /var/lib/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -l config -r -F -d 'rdmad\'s config: the socket and state directory when not given, and for doctor [peermem] mode and the declared PFs (default /etc/rdmad)'
complete -c rdmad-ctl -n '__fish_seen_subcommand_from doctor' -l root -r -a '(__fish_complete_directories)' -d 'read the host\'s /sys, /proc, /lib/modules and /boot under DIR (default /)'
