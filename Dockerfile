# lmqd in a container: a slim Python base, lmq installed without extras, a non-root user, the
# data directory on a volume, and a health check on nsqd's /ping.
#
#   docker build -t lmqd .
#   docker run -p 4150:4150 -p 4151:4151 -v lmqd-data:/data lmqd
#   docker run lmqd --mem-queue-size=0 --durable        # extra flags replace CMD's defaults
#
# deploy/compose.yaml runs an lmqlookupd and two lmqd nodes; docs/operations.md, "Deployment".
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY lmqd ./lmqd
COPY lmq_client ./lmq_client
RUN pip install . && rm -rf /src

# A fixed uid, so a volume's ownership is the same on every host.
RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin lmq \
    && mkdir -p /data && chown lmq:lmq /data
USER lmq
WORKDIR /data
VOLUME ["/data"]

# nsqd's ports: 4150 TCP (the V2 protocol), 4151 HTTP (the API, /ping, /metrics).
EXPOSE 4150 4151

# /ping answers 200 "OK" while healthy and 500 "NOK - <reason>" while writes fail (nsqd).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:4151/ping', timeout=2).status != 200)"]

# SIGTERM (docker stop) is lmqd's graceful shutdown: memory queues go to /data first.
STOPSIGNAL SIGTERM
ENTRYPOINT ["lmqd"]
CMD ["--data-path=/data", "--tcp-address=0.0.0.0:4150", "--http-address=0.0.0.0:4151"]
