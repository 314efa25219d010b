package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes is CPU time used so far: this process (load generator,
// simulator, proxies, control plane, data plane) and, separately, its
// descendant processes (the embedded Postgres).
type cpuTimes struct {
	self, children time.Duration
}

func (c cpuTimes) sub(o cpuTimes) cpuTimes {
	return cpuTimes{self: c.self - o.self, children: c.children - o.children}
}

func readCPU() cpuTimes {
	var ru syscall.Rusage
	var c cpuTimes
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c.children = descendantsCPU(os.Getpid())
	return c
}

// clockTick is USER_HZ, 100 on every Linux architecture Go supports.
const clockTick = 100

// descendantsCPU sums user+system time of every live descendant of pid,
// with what each has reaped from its own children: Postgres backends that
// exit are counted by the postmaster.
func descendantsCPU(pid int) time.Duration {
	t := readProcTable()
	return ticksDuration(t.tree(pid) - t.ticks[pid])
}

// tree is the ticks of root's whole process tree, with what each process
// has reaped from its own children: what a target has used.
func (t procTable) tree(root int) int64 {
	var total int64
	for p, ticks := range t.ticks {
		if t.under(p, root) {
			total += ticks
		}
	}
	return total
}

func ticksDuration(ticks int64) time.Duration { return time.Duration(ticks) * time.Second / clockTick }

// procTable is every process's parent and CPU ticks, read at once.
type procTable struct {
	parent map[int]int
	ticks  map[int]int64
}

func readProcTable() procTable {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	t := procTable{parent: map[int]int{}, ticks: map[int]int64{}}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		p, pp, n, ok := parseStat(b)
		if ok {
			t.parent[p], t.ticks[p] = pp, n
		}
	}
	return t
}

// under says p is root or one of its descendants.
func (t procTable) under(p, root int) bool {
	for a := p; a > 1; a = t.parent[a] {
		if a == root {
			return true
		}
	}
	return false
}

// parseStat reads pid, ppid and utime+stime+cutime+cstime from a
// /proc/PID/stat line; the command name may hold spaces and parentheses.
func parseStat(b []byte) (pid, ppid int, ticks int64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return 0, 0, 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:open])))
	if err != nil {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	for _, s := range f[11:15] {
		n, _ := strconv.ParseInt(s, 10, 64)
		ticks += n
	}
	return pid, ppid, ticks, true
}

// memStatus is this process's resident memory from /proc/self/status.
type memStatus struct {
	rss, hwm int64 // bytes: VmRSS, VmHWM (peak since start or the last resetPeak)
}

// readMem reads VmRSS and VmHWM from a /proc/<pid>/status file.
func readMem(status string) (memStatus, error) {
	f, err := os.Open(status)
	if err != nil {
		return memStatus{}, err
	}
	defer f.Close()
	var m memStatus
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "VmHWM":
			dst = &m.hwm
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return m, fmt.Errorf("%s %s: %w", status, k, err)
		}
		*dst = kb << 10
	}
	return m, sc.Err()
}

// resetPeak sets VmHWM back to the current RSS (Linux ≥ 4.0), so a phase's
// peak is its own.
func resetPeak(clearRefs string) error {
	return os.WriteFile(clearRefs, []byte("5"), 0)
}

// raiseFileLimit lifts RLIMIT_NOFILE to want (or the hard limit, raising
// that too when privileged): every open stream costs four to six
// descriptors in this one process.
func raiseFileLimit(want uint64) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur >= want {
		return rl.Cur, nil
	}
	if rl.Max < want {
		try := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &try) == nil {
			return want, nil
		}
		want = rl.Max
	}
	rl.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	return want, nil
}

// quiesce waits, up to 15 s, until this process and Postgres together use
// under a fifth of a core over 100 ms: a step's leftovers (route reports
// still in the data plane's queue, Postgres writing them) are then
// counted in that step, not the next. It polls CPU time; there is no
// event for "idle".
func quiesce(ctx context.Context) {
	quiesceOn(ctx, func() time.Duration {
		c := readCPU()
		return c.self + c.children
	})
}

// quiesceOn is quiesce for whatever processes used reads the CPU of.
func quiesceOn(ctx context.Context, used func() time.Duration) {
	const window = 100 * time.Millisecond
	deadline := time.Now().Add(15 * time.Second)
	prev := used()
	tick := time.NewTicker(window)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cur := used()
		if cur-prev < window/5 {
			return
		}
		prev = cur
	}
}
