#!/bin/bash
# PID 1 of gowarp's siw guest (installed as /sbin/gowarp-init by
# internal/guest). It brings up eth0 for QEMU's user network, loads siw and
# makes siw0 on eth0, mounts the host's 9p share on /share, and then runs
# the jobs the host drops into /share/jobs, one at a time, in order:
# jobs/N.sh runs with its output in jobs/N.out and, when done, its exit
# status in jobs/N.rc; one that runs into its limit leaves jobs/N.stuck,
# what its processes were doing. The file jobs/stop powers the guest off.
#
# A job sees $J (the jobs directory), $N (its number) and the function
# listen_then_wait N PORT CMD..., which runs a server, touches jobs/N.listening
# once PORT listens, and waits for the server to end.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
umask 022

say() { echo "gowarp-init: $*" >/dev/console; }

mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
hostname gowarp-siw
ulimit -l unlimited # memory registration pins pages

poweroff_now() {
  sync
  echo o >/proc/sysrq-trigger
  sleep 10
  exit 1 # PID 1 exits: the kernel panics and QEMU (-no-reboot) ends
}

ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2 dev eth0

modprobe siw || say "ERROR: modprobe siw failed"
modprobe ib_uverbs
modprobe rdma_ucm
rdma link add siw0 type siw netdev eth0 || say "ERROR: rdma link add siw0 failed"
if grep -qw gowarp.debug=1 /proc/cmdline; then
  # siw logs MPA and QP events only through dynamic debug.
  mount -t debugfs debugfs /sys/kernel/debug
  echo 'module siw +p' >/sys/kernel/debug/dynamic_debug/control
  dmesg -n 4 # keep the flood off the serial console
fi

mkdir -p /share
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share; then
  say "ERROR: no 9p share"
  poweroff_now
fi
J=/share/jobs
mkdir -p "$J"
{
  uname -r
  dpkg-query -W -f='${Package} ${Version}\n' rdma-core rdmacm-utils ibverbs-utils perftest
  rdma link show
} >/share/guestinfo.txt 2>&1
say "ready: $(uname -r), $(rdma link show 2>&1 | head -1)"
touch /share/ready

listen_then_wait() {
  local n=$1 port=$2
  shift 2
  "$@" &
  local pid=$!
  for _ in $(seq 1 600); do
    if ss -Hltn "sport = :$port" | grep -q .; then
      touch "$J/$n.listening"
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  wait "$pid"
}
export -f listen_then_wait
export J

# descendants PID: the processes under PID, each on a line.
descendants() {
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

# code_at MAPS: each hex address on standard input that lies in code (an
# r-xp mapping of MAPS, a /proc/PID/maps) as OBJECT+OFFSET, at most 16.
code_at() {
  awk -v maps="$1" '
    function hex(h,  i, n) {
      sub(/^0x/, "", h); h = tolower(h); n = 0
      for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
      return n
    }
    BEGIN {
      while ((getline line < maps) > 0) {
        split(line, f, " ")
        if (f[2] != "r-xp") continue
        split(f[1], r, "-")
        m++; lo[m] = hex(r[1]); hi[m] = hex(r[2]); off[m] = hex(f[3]); obj[m] = (f[6] == "" ? "?" : f[6])
      }
    }
    {
      for (w = 1; w <= NF; w++) {
        a = hex($w)
        for (i = 1; i <= m; i++) if (a >= lo[i] && a < hi[i]) {
          printf "%s+0x%x\n", obj[i], a - lo[i] + off[i]
          if (++k == 16) exit
          break
        }
      }
    }'
}

# stuck_report SECS PID: every thread under PID (the job's timeout), with
# its state, kernel wait and stack, then, with the process stopped, its
# system call and where it was in user space (/proc/PID/syscall gives the
# call's number and arguments, or -1, then SP and PC; PC is shown as an
# offset in its object, for objdump); then the guest's RDMA and TCP
# state and siw's last words.
stuck_report() {
  echo "the job still ran $1 s after it began; its processes:"
  local pids p tk sc pc sp
  pids=$(descendants "$2")
  for p in $pids; do
    [[ -d /proc/$p ]] || continue
    echo "== pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline)"
    for tk in /proc/"$p"/task/*; do
      echo "-- thread ${tk##*/} ($(cat "$tk"/comm)): state $(cut -d' ' -f3 "$tk"/stat), wchan $(cat "$tk"/wchan)"
      sed 's/^/   /' "$tk"/stack
    done
  done
  # All stopped while the rest is read: a spinning job takes the guest's
  # one CPU from the report (under TCG, with two spinners, the first
  # pass took 3.8 s, the whole report 9 s; a spinner alone had made it 8).
  for p in $pids; do kill -STOP "$p" 2>/dev/null; done
  for p in $pids; do
    [[ -d /proc/$p ]] || continue
    echo "== pid $p, stopped"
    for tk in /proc/"$p"/task/*; do
      sc=$(cat "$tk"/syscall)
      pc=${sc##* }
      echo "-- thread ${tk##*/}: syscall $sc"
      [[ $pc == 0x* ]] || continue
      sp=${sc% *}
      sp=${sp##* }
      echo "$pc" | code_at /proc/"$p"/maps | sed 's/^/   pc /'
      # Return addresses, roughly: the words of the stack's first 2 KiB
      # that point into code, innermost first.
      dd if=/proc/"$p"/mem bs=8 skip=$((sp / 8)) count=256 2>/dev/null | od -An -v -tx8 |
        code_at /proc/"$p"/maps | sed 's/^/   stack /'
    done
  done
  echo "== rdma res show qp"
  rdma res show qp
  echo "== rdma res show cm_id"
  rdma res show cm_id
  echo "== ss -tanoi"
  ss -tanoi
  echo "== dmesg (last 15)"
  dmesg | tail -15
  for p in $pids; do kill -CONT "$p" 2>/dev/null; done
}

n=1
while :; do
  while [[ ! -f "$J/$n.sh" ]]; do
    if [[ -f "$J/stop" ]]; then
      dmesg >/share/dmesg.txt
      say "stop after $((n - 1)) jobs"
      poweroff_now
    fi
    sleep 0.05
  done
  t=$(sed -n '1s/^# timeout \([0-9]*\)$/\1/p' "$J/$n.sh")
  t=${t:-120}
  N=$n timeout -k 5 "$t" bash "$J/$n.sh" >"$J/$n.out" 2>&1 </dev/null &
  job=$!
  # A job that runs into its limit leaves, a little before it, what its
  # processes were doing in jobs/N.stuck: a rare hang says where it was
  # without a second job, which could only run after this one. Once the
  # report has begun it is finished (it takes seconds under TCG when the
  # job spins).
  (
    trap 'kill $s 2>/dev/null; exit 0' TERM
    lead=$((t > 40 ? t - 20 : t / 2))
    sleep $lead &
    s=$!
    wait $s
    trap '' TERM
    stuck_report "$lead" "$job" >"$J/$n.stuck.tmp" 2>&1
    mv "$J/$n.stuck.tmp" "$J/$n.stuck"
  ) &
  watch=$!
  wait $job
  rc=$?
  kill $watch 2>/dev/null
  wait $watch
  # A job that ended by itself, however late, was not stuck (timeout's
  # statuses: 124, or 137 when it had to kill).
  [[ $rc == 124 || $rc == 137 ]] || rm -f "$J/$n.stuck"
  echo $rc >"$J/$n.rc.tmp" && mv "$J/$n.rc.tmp" "$J/$n.rc"
  n=$((n + 1))
done
