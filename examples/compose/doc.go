// Package compose holds the docker-compose packaging of the demo topology
// (docker-compose.yml, Dockerfile, the two Envoy bootstraps) and the test that checks it.
//
// There is no Docker engine where this repository is tested, so the compose file has not
// been run; compose_test.go checks its wiring instead, reading the compose file with the
// Compose specification's own loader (github.com/compose-spec/compose-go/v2, what `docker
// compose` uses: schema validation, merges, resolved paths) and the Dockerfile with
// BuildKit's parser (github.com/moby/buildkit/frontend/dockerfile/parser): it mounts the fleet file the local
// demo loads (examples/demo/fleet.yaml) into the control server, every engine in that file
// has a container at its address, each Envoy mounts a bootstrap that is byte for byte what
// bootstrap.Render makes for that node (the template the local demo renders too), and every
// image is the official Envoy v1.40 image or a stage of the Dockerfile. Regenerate the
// bootstraps with `go test ./examples/compose -update`.
package compose
