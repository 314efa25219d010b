package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Forecasts: the estimator is policy's (policy/forecast.go); this reads
// the snapshots it runs on.

// forecasts reads every account's recent snapshots in one query and
// forecasts each window with enough history.
func (s *Server) forecasts(ctx context.Context, now time.Time) (map[uuid.UUID][]*weirv1.Forecast, error) {
	rows, err := s.q.RecentUsageSnapshots(ctx, now.Add(-policy.ForecastHistory))
	if err != nil {
		return nil, fmt.Errorf("usage snapshots: %w", err)
	}
	out := make(map[uuid.UUID][]*weirv1.Forecast)
	// Rows come ordered by account, window and time: forecast each run.
	for i := 0; i < len(rows); {
		j := i
		var samples []policy.Sample
		for ; j < len(rows) && rows[j].AccountID == rows[i].AccountID && rows[j].WindowName == rows[i].WindowName; j++ {
			samples = append(samples, policySample(rows[j]))
		}
		if f, ok := policy.ForecastWindow(rows[i].WindowName, samples, now); ok {
			out[rows[i].AccountID] = append(out[rows[i].AccountID], f)
		}
		i = j
	}
	return out, nil
}
