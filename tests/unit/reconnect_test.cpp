// Both ends of the pool's reconnect backoff (pg/pool.hpp reconnect_delay_ms).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pg/pool.hpp"

using qsw::reconnect_delay_ms;

TEST(ReconnectDelay, DoublesFrom50msAndStaysShortForTheFirst30SecondsOfAnOutage) {
    EXPECT_EQ(reconnect_delay_ms(0, 0, 0.0), 25);
    EXPECT_EQ(reconnect_delay_ms(0, 0, 1.0), 50);
    EXPECT_EQ(reconnect_delay_ms(1, 0, 1.0), 100);
    EXPECT_EQ(reconnect_delay_ms(2, 0, 1.0), 200);
    EXPECT_EQ(reconnect_delay_ms(3, 0, 1.0), 250);   // capped: a failover's new primary is seconds away
    EXPECT_EQ(reconnect_delay_ms(50, 29999, 1.0), 250);
    EXPECT_EQ(reconnect_delay_ms(50, 29999, 0.0), 125);
}

TEST(ReconnectDelay, ALongOutageBacksOffToFiveSeconds) {
    EXPECT_EQ(reconnect_delay_ms(7, 30000, 1.0), 5000);
    EXPECT_EQ(reconnect_delay_ms(7, 30000, 0.0), 2500);
    EXPECT_EQ(reconnect_delay_ms(1000, std::numeric_limits<int64_t>::max(), 1.0), 5000);
    EXPECT_EQ(reconnect_delay_ms(2, 3600000, 1.0), 200);  // few failures yet: still short
}

TEST(ReconnectDelay, HostileInputsStayInBounds) {
    EXPECT_EQ(reconnect_delay_ms(-5, -5, 1.0), 50);
    EXPECT_EQ(reconnect_delay_ms(3, 0, std::nan("")), 125);
    EXPECT_EQ(reconnect_delay_ms(3, 0, 7.0), 125);
    EXPECT_EQ(reconnect_delay_ms(3, 0, -1.0), 125);
}
