//go:build unix

package pgembed

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

const (
	// sigFast asks the postmaster for a fast shutdown: roll back open
	// transactions, disconnect clients, checkpoint, exit.
	sigFast = syscall.SIGINT
	// sigImmediate is an immediate shutdown: exit now, recover from WAL on
	// the next start.
	sigImmediate = syscall.SIGQUIT
)

// account is the unprivileged user postgres runs as when weir runs as root.
type account struct {
	name     string
	uid, gid uint32
	home     string
}

// serverAccount returns nil when we are not root: postgres then simply runs
// as us. As root it returns the postgres system user, or nobody, because
// initdb and postgres refuse to run as root.
func serverAccount() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &account{name: name, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}, nil
	}
	return nil, errors.New("pgembed: weir runs as root but PostgreSQL refuses to, and neither a postgres nor a nobody user exists to run it as; create a postgres user or run weir unprivileged")
}

// sysProcAttr puts the child in its own process group, so a Ctrl-C in the
// terminal reaches only weir (which then stops postgres cleanly), drops to
// acct if set, and on Linux arranges for the kernel to stop the child if we
// die (see setParentDeathSignal).
func sysProcAttr(acct *account) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if acct != nil {
		// Empty Groups drops root's supplementary groups too.
		attr.Credential = &syscall.Credential{Uid: acct.uid, Gid: acct.gid, Groups: []uint32{}}
	}
	setParentDeathSignal(attr)
	return attr
}

// chownTree hands root and everything below it to acct. It only touches
// entries whose owner differs, so re-running it on every start is cheap.
func chownTree(root string, acct *account) error {
	if acct == nil {
		return nil
	}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == acct.uid && st.Gid == acct.gid {
			return nil
		}
		if err := os.Lchown(path, int(acct.uid), int(acct.gid)); err != nil {
			return fmt.Errorf("pgembed: chown %s: %w", path, err)
		}
		return nil
	})
}

// ensureSearchable makes sure acct can traverse every directory from / down
// to dir, which postgres needs to reach a data directory we (root) chose.
// The typical case is t.TempDir(): /tmp/TestX123/001, both 0700 and owned
// by root.
//
// We only ever add the other-execute (search) bit, which lets other users
// pass through a directory to names they already know but not list it, and
// only on directories owned by us (root): their permissions are ours to
// reason about. A directory owned by someone else is their policy, so we
// report it instead of changing it.
func ensureSearchable(dir string, acct *account, log *slog.Logger) error {
	if acct == nil {
		return nil
	}
	euid := uint32(os.Geteuid())
	for {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("pgembed: stat %s: %w", dir, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && !searchable(fi.Mode().Perm(), st, acct) {
			if st.Uid != euid {
				return fmt.Errorf("pgembed: %s is not searchable by user %s (uid %d), which runs postgres because weir runs as root; grant it search permission (chmod o+x) or choose a DataDir elsewhere", dir, acct.name, acct.uid)
			}
			if err := os.Chmod(dir, fi.Mode()|0o001); err != nil {
				return fmt.Errorf("pgembed: chmod o+x %s: %w", dir, err)
			}
			log.Info("pgembed: granted search permission so postgres can reach its data directory", slog.String("dir", dir), slog.String("user", acct.name))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return nil
		}
		dir = parent
	}
}

func searchable(perm fs.FileMode, st *syscall.Stat_t, acct *account) bool {
	switch {
	case st.Uid == acct.uid:
		return perm&0o100 != 0
	case st.Gid == acct.gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// processAlive reports whether pid exists. EPERM means it exists but
// belongs to someone else.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
