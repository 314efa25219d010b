package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotFound is what the store boundary makes of pgx.ErrNoRows.
var ErrNotFound = errors.New("not found")

// errInvalid marks a request the caller must fix.
type errInvalid struct{ msg string }

func (e errInvalid) Error() string { return e.msg }

func invalidf(format string, args ...any) error { return errInvalid{fmt.Sprintf(format, args...)} }

// storeErr maps database errors to domain errors at the store boundary.
func storeErr(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		return errConflict{constraint: pgErr.ConstraintName}
	}
	return err
}

type errConflict struct{ constraint string }

func (e errConflict) Error() string { return "already exists (" + e.constraint + ")" }

// toConnect is the one place domain errors become Connect codes (the error
// interceptor applies it to every handler's error). Internal errors are
// logged there and reach the client without detail.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var inv errInvalid
	var conflict errConflict
	switch {
	case errors.As(err, &inv):
		return connect.NewError(connect.CodeInvalidArgument, errors.New(inv.msg))
	case errors.Is(err, ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.As(err, &conflict):
		return connect.NewError(connect.CodeAlreadyExists, conflict)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	if databaseDown(err) {
		// Retryable: callers hold or redeliver until it is back.
		return connect.NewError(connect.CodeUnavailable, errors.New("database unavailable"))
	}
	return connect.NewError(connect.CodeInternal, errors.New("internal error"))
}

// databaseDown says whether err means Postgres cannot be reached or is
// restarting (as opposed to a query that failed): connection failures,
// timeouts, and the server's shutdown, crash and "starting up" errors
// (SQLSTATE classes 08 and 57P).
func databaseDown(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.Timeout(err) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
