package controlplane

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane/people"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// Roles on the admin services: a read (a NO_SIDE_EFFECTS procedure) is
// the viewer's; every other procedure has its role in procedureRoles, and
// TestProcedureRoles fails while one has none. A procedure missing here
// all the same (a new one, before its test ran) is the admin's: this
// fails closed.
var procedureRoles = map[string]people.Role{
	// Account actions: operators keep the pool running.
	weirv1connect.AccountServicePauseAccountProcedure:    people.Operator,
	weirv1connect.AccountServiceResumeAccountProcedure:   people.Operator,
	weirv1connect.AccountServiceRefreshUsageProcedure:    people.Operator,
	weirv1connect.AccountServiceClaimResetGrantProcedure: people.Operator,
	weirv1connect.DashboardServiceClearCooldownProcedure: people.Operator,
	weirv1connect.AccountServiceCreateAccountProcedure:   people.Admin,
	weirv1connect.AccountServiceUpdateAccountProcedure:   people.Admin,
	weirv1connect.AccountServiceDeleteAccountProcedure:   people.Admin,
	weirv1connect.KeyServiceCreateKeyProcedure:           people.Admin,
	weirv1connect.KeyServiceRevokeKeyProcedure:           people.Admin,
	weirv1connect.KeyServiceUpdateKeyProcedure:           people.Admin,
	weirv1connect.KeyServiceCreateTeamProcedure:          people.Admin,
	weirv1connect.KeyServiceUpdateTeamProcedure:          people.Admin,
	weirv1connect.KeyServiceDeleteTeamProcedure:          people.Admin,
	weirv1connect.SettingsServiceUpdateSettingsProcedure: people.Admin,
	weirv1connect.AliasServiceSetAliasProcedure:          people.Admin,
	weirv1connect.AliasServiceDeleteAliasProcedure:       people.Admin,
	weirv1connect.UsageServiceSetPriceProcedure:          people.Admin,
	weirv1connect.UsageServiceDeletePriceProcedure:       people.Admin,
	weirv1connect.NotifyServiceCreateTargetProcedure:     people.Admin,
	weirv1connect.NotifyServiceDeleteTargetProcedure:     people.Admin,
	weirv1connect.NotifyServiceSendTestProcedure:         people.Admin,
}

// roleFor is the role a call of spec needs.
func roleFor(spec connect.Spec) people.Role {
	if r, ok := procedureRoles[spec.Procedure]; ok {
		return r
	}
	if spec.IdempotencyLevel == connect.IdempotencyNoSideEffects {
		return people.Viewer
	}
	return people.Admin
}

// principal is who an admin call acts for, as the token interceptor
// found it: a name for the audit log, the credential checked, and the role.
type principal struct {
	name, credential string
	role             people.Role
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalOf(ctx context.Context) (principal, bool) {
	p, ok := ctx.Value(principalKey{}).(principal)
	return p, ok
}

var errNoRole = errors.New("your role may not do this")

// roleInterceptor refuses an admin call its principal's role does not
// allow. It runs after the audit interceptor, so a refusal is audited.
type roleInterceptor struct{}

func (roleInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := allowed(ctx, req.Spec()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (roleInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (roleInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := allowed(ctx, conn.Spec()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// allowed: LeaseService is the workers' (the data-plane token, no roles);
// any other call needs a principal whose role reaches the procedure's.
func allowed(ctx context.Context, spec connect.Spec) error {
	if isLeaseProcedure(spec.Procedure) {
		return nil
	}
	p, ok := principalOf(ctx)
	if !ok {
		return connect.NewError(connect.CodeUnauthenticated, errUnauthenticated)
	}
	if need := roleFor(spec); p.role < need {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%w: it needs %s, you are %s", errNoRole, need, p.role))
	}
	return nil
}
