package controlplane

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"
)

// errorInterceptor ends every unary call that fails: the handler returns
// its error as it is, and this logs the errors the client cannot act on
// (once, naming the procedure) and maps every error to its Connect code
// without internal detail (toConnect). An error the handler already made
// a *connect.Error is its answer, passed on as it is and not logged.
//
// WatchPool, the one streaming procedure, maps its own ends (watchErr):
// a worker leaving or a replica stopping is no failure to log.
func errorInterceptor(log *slog.Logger) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if ctx.Err() != nil {
				// Connect refuses the call before the handler runs: nothing
				// of ours failed.
				return next(ctx, req)
			}
			resp, err := next(ctx, req)
			if err == nil {
				return resp, nil
			}
			if clientFacing(err) {
				return nil, toConnect(err)
			}
			log.ErrorContext(ctx, "rpc failed", "op", req.Spec().Procedure, "err", err)
			return nil, toConnect(err)
		}
	}
}

// clientFacing says whether err is an answer to the caller rather than a
// failure of ours: a Connect error the handler chose, a request to fix,
// something not found or already there, or a call the caller cancelled.
func clientFacing(err error) bool {
	var ce *connect.Error
	var inv errInvalid
	var conflict errConflict
	return errors.As(err, &ce) || errors.Is(err, ErrNotFound) || errors.As(err, &inv) ||
		errors.As(err, &conflict) || errors.Is(err, context.Canceled)
}
