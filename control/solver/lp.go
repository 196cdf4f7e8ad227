package solver

import (
	"context"
	"fmt"
	"math"

	"github.com/lanl/clp"
)

// method is the CLP algorithm an LP is solved with.
type method int

const (
	dualSimplex method = iota
	primalSimplex
	barrierCrossover
)

func (m method) String() string {
	switch m {
	case dualSimplex:
		return "dual"
	case primalSimplex:
		return "primal"
	case barrierCrossover:
		return "barrier"
	}
	return fmt.Sprintf("method(%d)", int(m))
}

// lp accumulates a column-major LP in flat Go slices, then hands it to CLP in
// one pass. Every row is an equality (rowLo == rowUp) in this package.
type lp struct {
	rowLo, rowUp []float64
	colBnd       []clp.Bounds
	obj          []float64
	starts       []int // column j's nonzeros are idx/val[starts[j]:starts[j+1]]
	idx          []int
	val          []float64
}

func (b *lp) reset(rows int) {
	b.rowLo = resize(b.rowLo, rows)
	b.rowUp = resize(b.rowUp, rows)
	b.colBnd = b.colBnd[:0]
	b.obj = b.obj[:0]
	b.starts = append(b.starts[:0], 0)
	b.idx = b.idx[:0]
	b.val = b.val[:0]
}

func (b *lp) cols() int { return len(b.obj) }

// col1 adds a column with one nonzero and returns its index.
func (b *lp) col1(lo, up, cost float64, r int, v float64) int {
	b.idx = append(b.idx, r)
	b.val = append(b.val, v)
	return b.endCol(lo, up, cost)
}

// col2 adds a column with two nonzeros (r1 < r2) and returns its index.
func (b *lp) col2(lo, up, cost float64, r1 int, v1 float64, r2 int, v2 float64) int {
	b.idx = append(b.idx, r1, r2)
	b.val = append(b.val, v1, v2)
	return b.endCol(lo, up, cost)
}

func (b *lp) endCol(lo, up, cost float64) int {
	b.colBnd = append(b.colBnd, clp.Bounds{Lower: lo, Upper: up})
	b.obj = append(b.obj, cost)
	b.starts = append(b.starts, len(b.idx))
	return len(b.obj) - 1
}

// lpResult is a solved LP's primal column values and row duals (reduced
// cost of column j = obj[j] − Σ_i a_ij·dual[i]).
type lpResult struct {
	x, dual []float64
}

// solve loads the LP into a fresh CLP model and solves it. maxSeconds ≤ 0
// means no limit. CLP cannot be interrupted, so the caller's deadline is
// passed down as CLP's own time limit.
func (b *lp) solve(m method, maxSeconds float64) (lpResult, error) {
	mat := clp.NewPackedMatrix()
	// Without Reserve, CoinPackedMatrix grows per column and the build is
	// quadratic (52 s at 64×1024, design.md §10).
	mat.Reserve(b.cols(), len(b.idx), false)
	buf := make([]clp.Nonzero, 0, 4)
	for j := range b.obj {
		buf = buf[:0]
		for k := b.starts[j]; k < b.starts[j+1]; k++ {
			buf = append(buf, clp.Nonzero{Index: b.idx[k], Value: b.val[k]})
		}
		mat.AppendColumn(buf)
	}
	mat.SetDimensions(len(b.rowLo), b.cols())
	rb := make([]clp.Bounds, len(b.rowLo))
	for i := range rb {
		rb[i] = clp.Bounds{Lower: b.rowLo[i], Upper: b.rowUp[i]}
	}
	s := clp.NewSimplex()
	s.LoadProblem(mat, b.colBnd, b.obj, rb, nil)
	s.SetOptimizationDirection(clp.Minimize)
	if maxSeconds > 0 {
		s.SetMaxSeconds(maxSeconds)
	}
	var st clp.SimplexStatus
	switch m {
	case primalSimplex:
		st = s.Primal(clp.NoValuesPass, clp.NoStartFinishOptions)
	case barrierCrossover:
		st = s.Barrier(true)
	default:
		st = s.Dual(clp.NoValuesPass, clp.NoStartFinishOptions)
	}
	if st != clp.Optimal {
		sec := s.SecondaryStatus()
		if sec == clp.SecondaryStoppedOnTime {
			return lpResult{}, fmt.Errorf("CLP %s stopped at its %.3f s time limit: %w", m, maxSeconds, context.DeadlineExceeded)
		}
		return lpResult{}, fmt.Errorf("CLP %s simplex ended with status %d (secondary %d) on a %d×%d LP that is always feasible: numerical trouble, check the inputs' scale", m, st, sec, len(b.rowLo), b.cols())
	}
	return lpResult{x: s.PrimalColumnSolution(), dual: s.DualRowSolution()}, nil
}

// gain is how much a solution lowers the cost below the reference point,
// where every column is zero: −Σ obj·x.
func (b *lp) gain(res lpResult) float64 {
	g := 0.0
	for j, x := range res.x {
		g -= b.obj[j] * x
	}
	return g
}

func resize(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// clampTiny maps solver noise to exact zeros so that quantization and
// comparisons across periods see clean values.
func clampTiny(v, scale float64) float64 {
	if math.Abs(v) <= 1e-9*math.Max(1, scale) {
		return 0
	}
	return v
}
