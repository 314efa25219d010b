package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// bankedFunc adapts a function to BankedResetter.
type bankedFunc func(context.Context) (int, error)

func (f bankedFunc) ApplyBankedResets(ctx context.Context) (int, error) { return f(ctx) }

func TestBankedResetWorker(t *testing.T) {
	t.Parallel()
	calls := 0
	var fail error
	w := &BankedResetWorker{deps: Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Banked: bankedFunc(func(context.Context) (int, error) {
			calls++
			return 1, fail
		}),
	}}
	j := &river.Job[BankedResetArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: BankedResetArgs{}.Kind()}}
	if err := w.Work(t.Context(), j); err != nil || calls != 1 {
		t.Fatalf("Work: %v after %d calls", err, calls)
	}
	fail = errors.New("database gone")
	if err := w.Work(t.Context(), j); err == nil || !strings.Contains(err.Error(), "apply banked resets: database gone") {
		t.Fatalf("Work with a failing applier: %v", err)
	}
	opts := BankedResetArgs{}.InsertOpts()
	if (BankedResetArgs{}).Kind() != "banked_resets" || !opts.UniqueOpts.ByArgs || opts.UniqueOpts.ByPeriod != BankedResetInterval {
		t.Errorf("kind %q, insert opts %+v", BankedResetArgs{}.Kind(), opts.UniqueOpts)
	}
	// Registered only with an applier, every 60 s.
	without := len(Register(river.NewWorkers(), Deps{}))
	with := len(Register(river.NewWorkers(), Deps{Banked: w.deps.Banked}))
	if with != without+1 || BankedResetInterval.Seconds() != 60 {
		t.Errorf("periodic jobs %d with the applier, %d without", with, without)
	}
}
