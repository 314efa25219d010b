package controlplane

import (
	"context"
	"strings"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func validTeamName(name string) error {
	if name == "" || len(name) > maxTeamNameLen || strings.TrimSpace(name) != name {
		return invalidf("name: required, at most %d characters, no surrounding spaces", maxTeamNameLen)
	}
	if _, err := uuid.Parse(name); err == nil {
		return invalidf("name: must not look like a team id")
	}
	return nil
}

func (k keyService) CreateTeam(ctx context.Context, req *connect.Request[weirv1.CreateTeamRequest]) (*connect.Response[weirv1.CreateTeamResponse], error) {
	m := req.Msg
	if err := validTeamName(m.GetName()); err != nil {
		return nil, err
	}
	budgets, err := validBudgets("budgets", m.GetBudgets())
	if err != nil {
		return nil, err
	}
	var row db.Team
	err = k.tx(ctx, func(q *db.Queries) error {
		if row, err = q.CreateTeam(ctx, db.CreateTeamParams{Name: m.GetName(), Now: k.now()}); err != nil {
			return storeErr(err)
		}
		return setBudgets(ctx, q, uuid.NullUUID{}, uuid.NullUUID{UUID: row.ID, Valid: true}, budgets, k.now())
	})
	if err != nil {
		return nil, err
	}
	k.log.InfoContext(ctx, "team created", "team_id", row.ID, "name", row.Name)
	t, err := k.teamProto(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.CreateTeamResponse{Team: t}), nil
}

func (k keyService) UpdateTeam(ctx context.Context, req *connect.Request[weirv1.UpdateTeamRequest]) (*connect.Response[weirv1.UpdateTeamResponse], error) {
	m := req.Msg
	row, err := k.findTeam(ctx, m.GetId())
	if err != nil {
		return nil, err
	}
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) != 1 || paths[0] != "budgets" {
		return nil, invalidf("update_mask: name budgets")
	}
	budgets, err := validBudgets("budgets", m.GetBudgets())
	if err != nil {
		return nil, err
	}
	if err := k.tx(ctx, func(q *db.Queries) error {
		return setBudgets(ctx, q, uuid.NullUUID{}, uuid.NullUUID{UUID: row.ID, Valid: true}, budgets, k.now())
	}); err != nil {
		return nil, err
	}
	k.log.InfoContext(ctx, "team updated", "team_id", row.ID, "budgets", len(budgets))
	k.watch.announce(ctx)
	t, err := k.teamProto(ctx, row.ID)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.UpdateTeamResponse{Team: t}), nil
}

func (k keyService) ListTeams(ctx context.Context, _ *connect.Request[weirv1.ListTeamsRequest]) (*connect.Response[weirv1.ListTeamsResponse], error) {
	teams, err := k.teamProtos(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.ListTeamsResponse{Teams: teams}), nil
}

func (k keyService) DeleteTeam(ctx context.Context, req *connect.Request[weirv1.DeleteTeamRequest]) (*connect.Response[weirv1.DeleteTeamResponse], error) {
	row, err := k.findTeam(ctx, req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	if err := k.tx(ctx, func(q *db.Queries) error {
		if _, err := q.DeleteTeam(ctx, row.ID); err != nil {
			return err
		}
		return q.RefreshBudgeted(ctx)
	}); err != nil {
		return nil, err
	}
	k.log.InfoContext(ctx, "team deleted", "team_id", row.ID)
	k.watch.announce(ctx)
	return connect.NewResponse(&weirv1.DeleteTeamResponse{}), nil
}

// teamProtos is every team with its budgets and how many keys it has.
func (k keyService) teamProtos(ctx context.Context) ([]*weirv1.Team, error) {
	rows, err := k.q.ListTeams(ctx)
	if err != nil {
		return nil, err
	}
	budgets, err := k.budgetsByScope(ctx, k.now())
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.Team, 0, len(rows))
	for _, r := range rows {
		t := &weirv1.Team{Id: r.ID.String(), Name: r.Name, CreatedAt: timestamppb.New(r.CreatedAt), Keys: r.Keys}
		for _, b := range budgets[r.ID] {
			t.Budgets = append(t.Budgets, budgetProto("team", r.Name, b.Unit, b.Period, b.Amount, b.SpentTokens, b.SpentNanoUsd, b.PeriodStart, b.TimeZone))
		}
		out = append(out, t)
	}
	return out, nil
}

func (k keyService) teamProto(ctx context.Context, id uuid.UUID) (*weirv1.Team, error) {
	teams, err := k.teamProtos(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range teams {
		if t.Id == id.String() {
			return t, nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, errNoTeam)
}
