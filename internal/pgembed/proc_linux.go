package pgembed

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// setParentDeathSignal asks the kernel to send SIGQUIT (immediate shutdown)
// to the postmaster when its parent dies, even by SIGKILL, so a crashed or
// killed weir never leaves an orphan server holding the data directory.
// SIGQUIT rather than SIGINT because nobody is left to escalate if a fast
// shutdown stalls; WAL recovery on the next start makes it safe.
//
// The kernel tracks the forking thread, not the process (go.dev/issue/27505),
// so startChild pins that thread for the child's lifetime. Go sets the
// signal after dropping privileges, which would otherwise clear it.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGQUIT
}

// processInfo describes pid from /proc, so a stale postmaster.pid whose pid
// now belongs to another process (common in containers, where pids restart
// from 1) is not mistaken for a live server: comm is the command name, cwd
// the working directory ("" if we may not read it; a postmaster's is its
// data directory), zombie whether it has already exited. ok is false if
// /proc has nothing to say.
func processInfo(pid int) (comm, cwd string, zombie, ok bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return "", "", false, false
	}
	// Format: pid (comm) state ...; comm may itself contain ')'.
	s := string(stat)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open || closing+2 >= len(s) {
		return "", "", false, false
	}
	cwd, _ = os.Readlink(dir + "/cwd")
	return s[open+1 : closing], cwd, s[closing+2] == 'Z', true
}
