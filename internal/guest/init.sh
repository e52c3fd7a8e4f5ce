#!/bin/bash
# PID 1 of gowarp's siw guest (installed as /sbin/gowarp-init by
# internal/guest). It brings up eth0 for QEMU's user network, loads siw and
# makes siw0 on eth0, mounts the host's 9p share on /share, and then runs
# the jobs the host drops into /share/jobs, one at a time, in order:
# jobs/N.sh runs with its output in jobs/N.out and, when done, its exit
# status in jobs/N.rc. The file jobs/stop powers the guest off.
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
  N=$n timeout -k 5 "${t:-120}" bash "$J/$n.sh" >"$J/$n.out" 2>&1 </dev/null
  echo $? >"$J/$n.rc.tmp" && mv "$J/$n.rc.tmp" "$J/$n.rc"
  n=$((n + 1))
done
