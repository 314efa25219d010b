package controlplane

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// ListBreakers answers the overload breakers open now, for `weir status`
// and the dashboard: a storm is shown as what it is.
func (o opsService) ListBreakers(ctx context.Context, _ *connect.Request[weirv1.ListBreakersRequest]) (*connect.Response[weirv1.ListBreakersResponse], error) {
	rows, err := o.q.ListOpenBreakers(ctx)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListBreakersResponse{Breakers: make([]*weirv1.Breaker, 0, len(rows))}
	for _, b := range rows {
		out.Breakers = append(out.Breakers, &weirv1.Breaker{
			Provider: b.Provider, Family: b.Family, NextProbeAt: timestamppb.New(*b.OpenUntil),
			ProbeEvery:     durationpb.New(time.Duration(b.ProbeEveryMs) * time.Millisecond),
			ProbedAccounts: int32(len(b.ProbedAccounts)), Overloads: b.Overloads,
		})
	}
	return connect.NewResponse(out), nil
}
