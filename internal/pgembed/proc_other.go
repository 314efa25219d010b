//go:build !unix

package pgembed

import (
	"errors"
	"log/slog"
	"os"
	"syscall"
)

var errUnsupported = errors.New("pgembed: running a private PostgreSQL is only supported on Unix-like systems; set WEIR_DATABASE_URL to use an existing server")

var (
	sigFast      = os.Interrupt
	sigImmediate = os.Kill
)

type account struct {
	name string
	home string
}

func serverAccount() (*account, error)                      { return nil, errUnsupported }
func sysProcAttr(*account) *syscall.SysProcAttr             { return nil }
func chownTree(string, *account) error                      { return errUnsupported }
func ensureSearchable(string, *account, *slog.Logger) error { return errUnsupported }
func processAlive(int) bool                                 { return false }
func processInfo(int) (comm, cwd string, zombie, ok bool)   { return "", "", false, false }
