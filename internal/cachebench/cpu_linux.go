package cachebench

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gowarp/gowarp/internal/cputime"
)

// cpuTime is the user and system CPU time a process has used: this one
// (pid 0, getrusage) or another (/proc/pid/stat, in clock ticks of 10 ms).
// Zero when it cannot be read.
func cpuTime(pid int) time.Duration {
	if pid == 0 {
		return cputime.Self()
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command may hold spaces and parentheses: the fields follow the
	// last ')'. utime and stime are fields 14 and 15, the 12th and 13th
	// after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
