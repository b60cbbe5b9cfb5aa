# Ferry container image: `docker build -t ferry .` (or `buildah build -t ferry .`).
# A static binary on an empty base image, running as uid 65532; it runs
# `ferry serve --config /etc/ferry/ferry.yaml`, so mount the configuration
# there (docs/ferry.example.yaml) and publish the Kafka and admin ports:
#
#   docker run -v $PWD/ferry.yaml:/etc/ferry/ferry.yaml:ro -p 9092:9092 -p 9644:9644 ferry
#
# deploy/kubernetes is a Kustomize base that runs it as a StatefulSet. BUILDER
# is any image with a Go toolchain and /bin/sh; deploy/container_test.go builds
# with one made from the host's Go, where no registry is reachable.

ARG BUILDER=golang:1.26-bookworm

FROM ${BUILDER} AS build
WORKDIR /src
# GOPROXY and GOSUMDB pass through when given (--build-arg), else Go's defaults.
ARG GOPROXY
ARG GOSUMDB
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
	CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOCACHE=/root/.cache/go-build GOMODCACHE=/go/pkg/mod \
	go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/usr/local/bin/ferry ./cmd/ferry && \
	echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' >/out/passwd && \
	echo 'nonroot:x:65532:' >/out/group

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/passwd /out/group /etc/
COPY --from=build /out/usr/local/bin/ferry /usr/local/bin/ferry
# Kafka (lanes take the ports after 9092), admin API, gossip (TCP and UDP).
EXPOSE 9092 9644 7946 7946/udp
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["serve", "--config", "/etc/ferry/ferry.yaml"]
