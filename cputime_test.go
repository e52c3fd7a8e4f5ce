package gowarp_test

import "github.com/gowarp/gowarp/internal/cputime"

// cpuTime is the process's CPU time, user and system.
var cpuTime = cputime.Self
