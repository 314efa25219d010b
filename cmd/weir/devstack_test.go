package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// devStack is a running `weir dev --simulate` (its own embedded Postgres,
// control plane, data plane and simulator) as one test sees it.
type devStack struct {
	devInfo
	dataDir string
	t       *testing.T
	// stop stops a stack of startDev's and returns what `weir dev`
	// returned: nil when it stopped cleanly. startDev registers it with
	// t.Cleanup, failing the test on an error; a test that needs the
	// stack stopped sooner calls it itself, and later calls return nil.
	// Nil on the shared stack, which TestMain stops.
	stop func() error
}

// startDev starts a stack of the test's own on dataDir. Most tests use
// sharedDev instead: a stack of their own is for a test that needs it
// fresh (it counts what is in it), changes what every request sees
// (settings, pausing the demo accounts, faults on them) or stops it.
func startDev(t *testing.T, dataDir string) *devStack {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	info, stopped, err := launchDev(ctx, dataDir)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	s := &devStack{devInfo: info, dataDir: dataDir, t: t}
	s.stop = func() (err error) {
		once.Do(func() {
			cancel()
			err = stopped()
		})
		return err
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("weir dev did not stop cleanly: %v", err)
		}
	})
	return s
}

// shared is the package's one stack for the tests that do not interfere:
// each adds accounts, keys and aliases under names of its own and reads
// only those back. Started by the first test that asks, stopped by
// TestMain.
var shared struct {
	once    sync.Once
	info    devInfo
	dataDir string
	stopped func() error // nil until started
	cancel  context.CancelFunc
	err     error
}

// sharedDev returns the shared stack, starting it on first use.
func sharedDev(t *testing.T) *devStack {
	t.Helper()
	shared.once.Do(func() {
		shared.dataDir, shared.err = os.MkdirTemp("", "weir-dev-test-")
		if shared.err != nil {
			return
		}
		var ctx context.Context
		ctx, shared.cancel = context.WithCancel(context.Background())
		shared.info, shared.stopped, shared.err = launchDev(ctx, shared.dataDir)
	})
	if shared.err != nil {
		t.Fatalf("shared weir dev: %v", shared.err)
	}
	return &devStack{devInfo: shared.info, dataDir: shared.dataDir, t: t}
}

// stopSharedDev stops the shared stack if a test started it, and removes
// its data directory.
func stopSharedDev() error {
	if shared.dataDir == "" {
		return nil
	}
	var err error
	if shared.stopped != nil {
		shared.cancel()
		if err = shared.stopped(); err != nil {
			err = fmt.Errorf("the shared weir dev did not stop cleanly: %w", err)
		}
	}
	return errors.Join(err, os.RemoveAll(shared.dataDir))
}

// launchDev runs `weir dev --simulate` in-process on free ports until ctx
// ends, and waits for its dev.json. stopped waits for it to end after ctx
// does and returns what it returned.
func launchDev(ctx context.Context, dataDir string) (info devInfo, stopped func() error, err error) {
	e, out, errOut := testEnv(nil, "")
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--simulate", "--data-dir", dataDir,
			"--listen", "127.0.0.1:0", "--controlplane-listen", "127.0.0.1:0", "--sim-listen", "127.0.0.1:0"}, e)
	}()
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return devInfo{}, nil, fmt.Errorf("weir dev exited early: %v\nstderr:\n%s", err, errOut.String())
		case <-deadline:
			return devInfo{}, nil, fmt.Errorf("weir dev did not start within 60s\nstderr:\n%s", errOut.String())
		case <-ctx.Done():
			return devInfo{}, nil, fmt.Errorf("weir dev did not start: %w", ctx.Err())
		case <-tick.C:
		}
		if !strings.Contains(out.String(), "weir dev is running") {
			continue
		}
		info, err := readDevInfo(dataDir)
		if err != nil {
			return devInfo{}, nil, fmt.Errorf("read dev.json: %w", err)
		}
		return info, func() error { return <-done }, nil
	}
}

// command runs a weir command against the stack with the environment
// vars (WEIR_DATA_DIR is the stack's) and stdin.
func (s *devStack) command(vars map[string]string, stdin string, args ...string) (stdout, stderr string, err error) {
	env := map[string]string{"WEIR_DATA_DIR": s.dataDir}
	for k, v := range vars {
		env[k] = v
	}
	e, out, errOut := testEnv(env, stdin)
	err = run(s.t.Context(), args, e)
	return out.String(), errOut.String(), err
}

// admin runs an operator command against the stack and returns its
// output, stdout then stderr.
func (s *devStack) admin(args ...string) (string, error) { return s.adminIn("", args...) }

// adminIn is admin with stdin.
func (s *devStack) adminIn(stdin string, args ...string) (string, error) {
	out, errOut, err := s.command(nil, stdin, args...)
	return out + errOut, err
}
