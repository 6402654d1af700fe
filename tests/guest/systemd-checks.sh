#!/bin/bash
# The deployment checks, run in the v2 guest booted with Debian's systemd as PID 1
# (`cargo xtask vm-test --systemd`, xtask/src/vm_systemd.rs): the Debian package installed
# with dpkg, the shipped unit started with systemctl, and what the unit promises checked on
# the running agent. One JSON line per check on /dev/ttyS1 ({"start": NAME} before it,
# {"name", "pass", "output"} after, {"done": true, "seconds"} at the end), progress on the
# console as "@@ ..." lines; the guest powers off when the checks end.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
RESULTS=/dev/ttyS1
CONFIG=/etc/reactor/config.yaml
DELEGATED=/sys/fs/cgroup/system.slice/reactor.service
ONLY=$(sed -n 's/.*systemdchecks.only=\([^ ]*\).*/\1/p' /proc/cmdline)
STARTED=$(date +%s)

say() { echo "@@ $*" > /dev/ttyS0; }

# JSON string body: backslashes, quotes and control characters escaped, lines joined by \n.
escape() {
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' -e 's/\r//g' -e 's/[[:cntrl:]]//g' |
		awk 'NR > 1 { printf "\\n" } { printf "%s", $0 }'
}

# check NAME: runs the function NAME; it passes when the function returns 0.
check() {
	local name=$1 out rc
	if [ -n "$ONLY" ] && ! echo ",$ONLY," | grep -q ",$name,"; then
		return
	fi
	printf '{"start":"%s"}\n' "$name" > "$RESULTS"
	say "check $name"
	out=$("$name" 2>&1)
	rc=$?
	local pass=false
	[ $rc -eq 0 ] && pass=true
	printf '{"name":"%s","pass":%s,"output":"%s"}\n' "$name" "$pass" \
		"$(printf '%s\n(exit %s)' "$out" "$rc" | escape)" > "$RESULTS"
	say "$name: $pass"
}

# Ends the check (each runs in a subshell of its own).
fail() {
	echo "FAIL: $*"
	exit 1
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every half second (times are emulated).
wait_for() {
	local secs=$1 what=$2
	shift 2
	local end=$(($(date +%s) + secs))
	until "$@" > /dev/null 2>&1; do
		if [ "$(date +%s)" -ge "$end" ]; then
			echo "timed out after ${secs}s waiting for $what"
			return 1
		fi
		sleep 0.5
	done
}

main_pid() { systemctl show -P MainPID reactor; }

agent_answers() { reactor status --config "$CONFIG" > /dev/null; }

pod_field() { # NS/NAME FIELD
	reactor pod ls --json --config "$CONFIG" |
		jq -r --arg ns "${1%/*}" --arg n "${1#*/}" --arg f "$2" \
			'.[] | select(.namespace == $ns and .name == $n) | .[$f]'
}

pod_running() { [ "$(pod_field "$1" phase)" = Running ]; }

pod_failed() { [ "$(pod_field "$1" phase)" = Failed ]; }

# The pids in a pod's container cgroup (`cgroup` as `pod ls` gives it, below cgroupRoot).
pod_pids() {
	local cg
	cg=$(pod_field "$1" cgroup)
	cat "$DELEGATED$cg/app/cgroup.procs" 2>/dev/null
}

systemd_is_pid1() {
	echo "pid 1: $(cat /proc/1/comm), $(systemctl --version | head -1)"
	[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is not systemd"
	local state
	state=$(systemctl is-system-running --wait)
	echo "system: $state"
	grep -q '^0::/init.scope$' /proc/1/cgroup || fail "PID 1 is not in init.scope: $(cat /proc/1/cgroup)"
	stat -fc %T /sys/fs/cgroup | grep -q cgroup2 || fail "/sys/fs/cgroup is not cgroup2"
	echo "controllers at the root: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
	[ "$state" = running ] || { systemctl --failed --no-pager; fail "system is $state"; }
}

package_installs() {
	dpkg -i /root/reactor.deb || fail "dpkg -i"
	dpkg-query -W -f='${Status} ${Version}\n' reactor
	dpkg-query -W -f='${Status}' reactor | grep -q 'install ok installed' || fail "not installed"
	for f in /usr/bin/reactor /lib/systemd/system/reactor.service /etc/reactor/config.yaml \
		/usr/share/doc/reactor/copyright; do
		[ -e "$f" ] || fail "$f missing"
	done
	# The install neither enables nor starts the agent: the operator does, after the config.
	echo "enabled: $(systemctl is-enabled reactor), active: $(systemctl is-active reactor)"
	[ "$(systemctl is-enabled reactor)" = disabled ] || fail "the install enabled the unit"
	systemctl is-active -q reactor && fail "the install started the agent"
	return 0
}

enable_now_active_sources_attached() {
	systemctl enable --now reactor || { systemctl status --no-pager reactor; fail "enable --now"; }
	wait_for 180 "the agent's API" agent_answers || { systemctl status --no-pager reactor; return 1; }
	systemctl is-active -q reactor || fail "reactor is $(systemctl is-active reactor)"
	[ "$(systemctl is-enabled reactor)" = enabled ] || fail "not enabled"
	local status pid
	status=$(reactor status --config "$CONFIG")
	echo "$status" | grep -E '^(cgroups|source)'
	echo "$status" | grep -q "^cgroups: v2 below /system.slice/reactor.service" || fail "cgroup root"
	for s in ebpf psi; do
		echo "$status" | grep -q "^source $s: attached" || fail "source $s not attached"
	done
	if echo "$status" | grep '^source ' | grep -v ': attached'; then
		fail "a source is missing"
	fi
	# The agent's own process runs in the unit's `agent` child; its tree is beside it.
	pid=$(main_pid)
	echo "agent pid $pid: $(cat /proc/"$pid"/cgroup)"
	grep -qx '0::/system.slice/reactor.service/agent' /proc/"$pid"/cgroup || fail "agent's cgroup"
	[ -d "$DELEGATED/kubepods" ] || fail "no kubepods under $DELEGATED"
	echo "kubepods controllers: $(cat "$DELEGATED/kubepods/cgroup.controllers")"
	grep -qw memory "$DELEGATED/kubepods/cgroup.controllers" || fail "no memory controller in kubepods"
}

journal_has_the_log() {
	local log
	log=$(journalctl -u reactor --no-pager -o cat -b)
	echo "$log" | grep -E 'sense source|listening|started' | head -20
	echo "$log" | grep -q 'sense source attached' || fail "no 'sense source attached' in journalctl -u reactor"
	echo "$log" | grep -q 'source=ebpf' || fail "the eBPF source is not in the journal"
}

pod_applied_runs() {
	reactor pod apply -f /root/sleeper.yaml --config "$CONFIG" || fail "pod apply"
	wait_for 120 "sleeper Running" pod_running default/sleeper || return 1
	local pids
	pids=$(pod_pids default/sleeper)
	echo "sleeper: cgroup $(pod_field default/sleeper cgroup), pids $pids"
	[ -n "$pids" ] || fail "no process in the sleeper's container cgroup"
}

stop_leaves_the_pod_start_readopts_it() {
	local before after pid
	before=$(pod_pids default/sleeper)
	[ -n "$before" ] || fail "no sleeper process before the stop"
	systemctl stop reactor || fail "systemctl stop"
	systemctl is-active -q reactor && fail "still active after stop"
	for pid in $before; do
		kill -0 "$pid" 2> /dev/null || fail "pod process $pid died with the agent"
	done
	echo "stopped: agent $(systemctl is-active reactor); sleeper pids $before still running"
	systemctl start reactor || fail "systemctl start"
	wait_for 180 "the agent's API after the start" agent_answers || return 1
	wait_for 60 "sleeper listed Running" pod_running default/sleeper || return 1
	after=$(pod_pids default/sleeper)
	echo "restarted: agent pid $(main_pid), sleeper pids $after"
	[ "$before" = "$after" ] || fail "the sleeper's processes changed: $before -> $after"
}

# SCHED_FIFO 10 on the loop's thread (`reactor-loop`), normal scheduling on every other.
loop_thread_fifo_10_others_normal() {
	local pid task comm rest policy prio loops=0 bad=0
	pid=$(main_pid)
	for task in /proc/"$pid"/task/*; do
		comm=$(cat "$task/comm")
		rest=$(sed 's/.*) //' "$task/stat")
		# After the comm: state is field 3, rt_priority 40, policy 41.
		prio=$(echo "$rest" | awk '{ print $38 }')
		policy=$(echo "$rest" | awk '{ print $39 }')
		echo "thread ${task##*/} $comm: policy $policy priority $prio"
		if [ "$comm" = reactor-loop ]; then
			loops=$((loops + 1))
			[ "$policy" = 1 ] && [ "$prio" = 10 ] || bad=1
		else
			[ "$policy" = 0 ] && [ "$prio" = 0 ] || bad=1
		fi
	done
	[ $loops -ge 1 ] || fail "no reactor-loop thread"
	[ $bad -eq 0 ] || fail "a thread has the wrong scheduling"
	for p in $(pod_pids default/sleeper); do
		echo "pod process $p: $(chrt -p "$p" | tr '\n' ' ')"
		chrt -p "$p" | grep -q SCHED_OTHER || fail "pod process $p is not SCHED_OTHER"
	done
}

agent_oom_score_adj() {
	local pid adj
	pid=$(main_pid)
	adj=$(cat /proc/"$pid"/oom_score_adj)
	echo "agent $pid: oom_score_adj $adj"
	[ "$adj" = -999 ] || fail "oom_score_adj $adj"
	for p in $(pod_pids default/sleeper); do
		echo "sleeper (Guaranteed) $p: oom_score_adj $(cat /proc/"$p"/oom_score_adj)"
		[ "$(cat /proc/"$p"/oom_score_adj)" = -997 ] || fail "the sleeper's oom_score_adj"
	done
}

# A small node (256 MiB, allocatable thresholds only: the guest's root lives in memory),
# restarted through systemd, then the README's hog.
hog_evicted_before_any_oom_kill() {
	local events ooms
	sed -i '/^evictionHard:/,/^$/d' "$CONFIG"
	cat >> "$CONFIG" <<-'EOF'

		node: {memoryCapacity: 256Mi, cpuCapacity: '2'}
		evictionHard: {allocatableMemory.available: 96Mi}
	EOF
	reactor config check "$CONFIG" || fail "edited config"
	systemctl restart reactor || fail "restart"
	wait_for 180 "the agent's API after the restart" agent_answers || return 1
	wait_for 60 "sleeper re-adopted" pod_running default/sleeper || return 1
	reactor pod apply -f /root/hog.yaml --config "$CONFIG" || fail "hog apply"
	wait_for 300 "the hog to end" pod_failed default/hog || { reactor pod ls --config "$CONFIG"; return 1; }
	reactor pod ls --config "$CONFIG"
	events="$DELEGATED/kubepods/memory.events"
	echo "kubepods memory.events: $(tr '\n' ' ' < "$events")"
	ooms=$(awk '$1 == "oom_kill" { print $2 }' "$events")
	[ "$(pod_field default/hog reason)" = Evicted ] || fail "the hog was not evicted: $(pod_field default/hog reason)"
	[ "$ooms" = 0 ] || fail "the kernel OOM-killed $ooms in kubepods"
	journalctl -k -b --no-pager | grep -i 'out of memory' && fail "a kernel OOM kill in the journal"
	# Every decision that acted, and what the agent said about its victims after.
	journalctl -u reactor -b --no-pager -o cat | grep -E 'eviction decision.*"type":"(evicted|released)"|pending|recovery' | cut -c1-1200
	pod_running default/sleeper || fail "the sleeper did not survive: $(pod_field default/sleeper message)"
}

say "systemd checks: $(uname -r), $(nproc) cpu, $(grep MemTotal /proc/meminfo)"
check systemd_is_pid1
check package_installs
check enable_now_active_sources_attached
check journal_has_the_log
check pod_applied_runs
check stop_leaves_the_pod_start_readopts_it
check loop_thread_fifo_10_others_normal
check agent_oom_score_adj
check hog_evicted_before_any_oom_kill
printf '{"done":true,"seconds":%s}\n' "$(($(date +%s) - STARTED))" > "$RESULTS"
say "systemd checks done"
sync
systemctl --no-block poweroff
