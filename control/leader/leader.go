// Package leader elects one control server replica at a time with a coordination.k8s.io
// Lease (client-go's leader election). The leader serves xDS and solves; the others stand
// by, warm, following the leader's published weights so that a new leader starts from them.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Config configures an election.
type Config struct {
	Client kubernetes.Interface
	// Namespace and Name are the Lease's.
	Namespace, Name string
	// Identity is this replica's, unique among them: its HTTP address as other replicas
	// reach it (they read the leader's /debug/state there).
	Identity string
	// LeaseDuration is how long a dead leader's Lease holds others off; RenewDeadline how
	// long the leader retries renewing before it gives up; RetryPeriod how often each tries.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       *slog.Logger
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.Client == nil || c.Log == nil:
		return errors.New("leader election: a client and a logger are required")
	case c.Namespace == "" || c.Name == "":
		return errors.New("--leader-elect-namespace and --leader-elect-lease are required with --leader-elect")
	case c.Identity == "":
		return errors.New("--leader-elect-identity is required with --leader-elect")
	case !(c.RetryPeriod > 0 && c.RenewDeadline > c.RetryPeriod && c.LeaseDuration > c.RenewDeadline):
		return fmt.Errorf("leader election: want lease duration (%s) > renew deadline (%s) > retry period (%s) > 0",
			c.LeaseDuration, c.RenewDeadline, c.RetryPeriod)
	}
	return nil
}

// Run campaigns until ctx is done or leadership, once held, is lost. lead runs while this
// replica leads (its ctx ends when leadership is lost); follow is called with each new
// leader's identity (this replica's own too). Run returns nil when ctx ended, and an error
// when leadership was lost: the process should exit and start again as a follower, since
// what it published may already be stale.
func Run(ctx context.Context, c Config, lead func(context.Context), follow func(identity string)) error {
	if err := c.Validate(); err != nil {
		return err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, c.Namespace, c.Name, c.Client.CoreV1(), c.Client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: c.Identity})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	var led atomic.Bool // set in client-go's goroutine, read after Run
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.LeaseDuration,
		RenewDeadline:   c.RenewDeadline,
		RetryPeriod:     c.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            c.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				led.Store(true)
				c.Log.Info("leader election: leading", "lease", c.Namespace+"/"+c.Name, "identity", c.Identity)
				lead(ctx)
			},
			OnStoppedLeading: func() {
				if led.Load() {
					c.Log.Error("leader election: lost the lease", "lease", c.Namespace+"/"+c.Name, "identity", c.Identity)
				}
			},
			OnNewLeader: func(id string) {
				c.Log.Info("leader election: leader is", "identity", id)
				follow(id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	le.Run(ctx)
	if ctx.Err() == nil && led.Load() {
		return fmt.Errorf("leader election: lost the lease %s/%s", c.Namespace, c.Name)
	}
	return nil
}
