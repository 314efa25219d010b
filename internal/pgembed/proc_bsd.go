//go:build unix && !linux

package pgembed

import "syscall"

// setParentDeathSignal is a no-op: only Linux can tie a child's life to its
// parent's. Elsewhere an orphaned postmaster survives a killed weir; the
// next Start reports it by pid.
func setParentDeathSignal(*syscall.SysProcAttr) {}

// processInfo has no portable source outside Linux.
func processInfo(int) (comm, cwd string, zombie, ok bool) { return "", "", false, false }
