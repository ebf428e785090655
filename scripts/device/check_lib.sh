# check_lib.sh — the PASS/FAIL lines of the training device scripts
# (train_check.sh, train_speed.sh, zero_check.sh), sourced by them after
# they set $logs (the log folder) and ok=1.
#
#   pass NAME            "PASS NAME"
#   fail NAME WHY        "FAIL NAME (WHY)", and ok=0
#   run NAME COMMAND...  the command's output to $logs/NAME.log; PASS on
#                        exit 0, FAIL otherwise (77: a test that saw no GPU)
#                        with the log's last lines; returns 0 when it passed

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1 ($2)"; ok=0; }
run() {
    name=$1
    shift
    "$@" > "$logs/$name.log" 2>&1
    rc=$?
    case $rc in
    0) pass "$name"; return 0 ;;
    77) fail "$name" "skipped: no GPU seen; log $logs/$name.log" ;;
    *) fail "$name" "exit $rc; log $logs/$name.log"; tail -n 5 "$logs/$name.log" | sed 's/^/    /' ;;
    esac
    return 1
}
