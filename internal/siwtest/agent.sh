#!/bin/bash
# Guest half of the siw interop suite (run by siwvm's run.sh -S as
# /share/cmd.sh). It runs the jobs the host drops into /share/jobs, one at
# a time, in order: jobs/N.sh runs with its output in jobs/N.out and its
# exit status, when done, in jobs/N.rc. A job that starts a server touches
# jobs/N.listening once the port listens (see listen_then_wait). The file
# jobs/stop ends the agent, and with it the VM.
J=/share/jobs
mkdir -p "$J"
echo "agent: up, $(uname -r), $(dpkg-query -W -f='${Version}' rdmacm-utils perftest 2>/dev/null | tr '\n' ' ')"

# listen_then_wait N PORT CMD...: run a server, mark it listening, wait for it.
listen_then_wait() {
  local n=$1 port=$2; shift 2
  "$@" &
  local pid=$!
  for _ in $(seq 1 300); do
    if ss -Hltn "sport = :$port" | grep -q .; then touch "$J/$n.listening"; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  wait "$pid"
}
export -f listen_then_wait
export J

n=1
while :; do
  while [[ ! -f "$J/$n.sh" ]]; do
    [[ -f "$J/stop" ]] && { echo "agent: stop after $((n-1)) jobs"; exit 0; }
    sleep 0.1
  done
  t=$(head -1 "$J/$n.sh" | sed -n 's/^# timeout \([0-9]*\)$/\1/p')
  echo "agent: job $n: $(sed -n 2p "$J/$n.sh")"
  N=$n timeout -k 5 "${t:-120}" bash "$J/$n.sh" >"$J/$n.out" 2>&1
  echo $? >"$J/$n.rc.tmp" && mv "$J/$n.rc.tmp" "$J/$n.rc"
  echo "agent: job $n rc=$(cat "$J/$n.rc")"
  n=$((n+1))
done
